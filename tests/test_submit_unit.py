"""The pieces of `inspector submit` without a server: gates, CI tags, what is uploaded,
flag errors, and that the client never imports torch."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile

import pytest

from inspector.ci.citags import ci_tags
from inspector.ci.gates import (
    check_budgets,
    check_drift,
    check_findings,
    check_increases,
    gate_figures,
    gates_markdown,
    gates_table,
    parse_increase,
    report_drift,
)
from inspector.ci.upload_source import resolve_input, resolve_model
from inspector.cli import main
from inspector.errors import InputSpecError, LoadError

GiB = 1024**3
FIGS = {"params": 110, "flops_forward": 2000, "train_peak_bytes": 21 * GiB,
        "forward_peak_bytes": None, "findings_errors": 0, "findings_warnings": 2}  # fmt: skip
BASE = {"params": 100, "flops_forward": 2000, "train_peak_bytes": 20 * GiB}


def verdicts(results):
    return [(r.gate, r.verdict) for r in results]


def test_budgets_compare_with_the_limit_and_missing_figures_fail():
    results = check_budgets(FIGS, {"train_peak": 20 * GiB, "params": 110, "forward_peak": 1})
    # 21 GiB > 20 GiB fails; 110 <= 110 passes (the limit is inclusive); forward peak unknown
    assert verdicts(results) == [("max train_peak", "fail"), ("max params", "pass"),
                                 ("max forward_peak", "fail")]  # fmt: skip
    assert results[0].value == "21.00 GiB" and results[0].limit == "≤ 20.00 GiB"
    assert results[2].value == "not computed"


def test_relative_and_absolute_increases():
    incs = [parse_increase(t) for t in ("params=10%", "params=9%", "flops=0%", "train_peak=1GiB")]
    results = check_increases(FIGS, BASE, incs)
    # params: +10 of 100 = +10.0%: passes at 10%, fails at 9%; flops unchanged passes 0%;
    # train peak +1 GiB passes an absolute +1 GiB
    assert [r.verdict for r in results] == ["pass", "fail", "pass", "pass"]
    assert results[0].value == "110 (+10, +10.0%)" and results[0].limit == "+10%"
    assert results[3].limit == "+1.00 GiB"
    skipped = check_increases(FIGS, None, incs[:1])
    assert skipped[0].verdict == "skipped" and skipped[0].note == "no baseline report"
    assert check_increases(FIGS, {"params": None}, incs[:1])[0].verdict == "skipped"


def test_parse_increase_rejects_nonsense():
    assert parse_increase("train-peak=100MiB").amount == 100 * 1024**2
    for bad in ("params", "speed=10%", "params=ten%", "params=abc"):
        with pytest.raises(ValueError):
            parse_increase(bad)


def test_findings_gate():
    assert check_findings(FIGS, "error").verdict == "pass"  # 0 errors
    assert check_findings(FIGS, "warning").verdict == "fail"  # 2 warnings
    assert check_findings(FIGS, "none") is None


def test_gate_tables():
    results = check_budgets(FIGS, {"params": 100}) + [check_findings(FIGS, "warning")]
    lines = gates_table(results).splitlines()
    assert lines[0].split() == ["Figure", "Value", "Limit", "Verdict"]
    assert lines[2].split() == ["Parameters", "110", "≤", "100", "FAIL"]
    md = gates_markdown(results)
    assert "| Parameters | 110 | ≤ 100 | ❌ **FAIL** |" in md and "2 gate(s) failed" in md


def test_graph_breaks_gate_reads_the_report_the_row_carries():
    body = {**FIGS, "report": {"compile": {"computed": True, "graph_break_count": 3}}}
    figures = gate_figures(body)
    assert figures["graph_break_count"] == 3 and figures["params"] == 110  # row kept
    results = check_budgets(figures, {"graph_breaks": 2}) + check_budgets(
        figures, {"graph_breaks": 3}
    )
    # 3 breaks > 2 fails; 3 <= 3 passes
    assert verdicts(results) == [("max graph_breaks", "fail"), ("max graph_breaks", "pass")]
    assert results[0].figure == "Graph breaks (torch.compile)" and results[0].value == "3"
    # a report without the compile section cannot pass a graph-break limit
    missing = check_budgets(gate_figures(FIGS), {"graph_breaks": 10})[0]
    assert (missing.verdict, missing.value) == ("fail", "not computed")
    old = gate_figures({"report": {"compile": {"graph_break_count": 1}}})
    [inc] = check_increases(figures, old, [parse_increase("graph_breaks=0")])
    assert (inc.verdict, inc.value) == ("fail", "3 (+2, +200.0%)")  # 1 -> 3 breaks


def test_drift_gate_warns_or_fails_on_a_changed_set_up():
    def body(torch: str, dtype: str) -> dict:
        meta = {
            "versions": {"torch": torch, "python": "3.11.9"},
            "device": "cpu",
            "options": {"dtype": dtype, "optimizer": "adamw"},
            "dims": {"B": 8},
        }
        return {**FIGS, "report": {"meta": meta}}  # fmt: skip

    base, same, upgraded = (
        body("2.13.0", "float32"),
        body("2.13.0", "float32"),
        body("2.14.0", "float32"),
    )
    assert check_drift(report_drift(same, base)).verdict == "pass"
    drift = report_drift(upgraded, base)
    warned = check_drift(drift)
    assert (warned.verdict, warned.value) == ("warn", "torch 2.13.0 → 2.14.0")
    assert check_drift(drift, fail=True).verdict == "fail"  # --fail-on-drift
    # a baseline row without its report: the set-up cannot be compared, said so
    unknown = check_drift(report_drift(upgraded, FIGS))
    assert (unknown.verdict, unknown.note) == ("skipped", "a report is missing")
    assert "WARN" in gates_table([warned]) and "⚠️ drift" in gates_markdown([warned])
    assert "All gates passed" in gates_markdown([warned])  # a warning fails nothing


def test_ci_tags_github_pull_request_and_gitlab():
    github = {"GITHUB_ACTIONS": "true", "GITHUB_SHA": "f00", "GITHUB_RUN_ID": "7",
              "GITHUB_REF": "refs/pull/42/merge", "GITHUB_REF_NAME": "42/merge",
              "GITHUB_HEAD_REF": "feature"}  # fmt: skip
    assert ci_tags(github) == {"ci": "github", "commit": "f00", "branch": "feature", "pr": "42",
                               "ci_job": "7"}  # fmt: skip
    push = {"GITHUB_SHA": "f00", "GITHUB_REF": "refs/heads/main", "GITHUB_REF_NAME": "main"}
    assert ci_tags(push) == {"ci": "github", "commit": "f00", "branch": "main"}
    gitlab = {"GITLAB_CI": "true", "CI_COMMIT_SHA": "ba5", "CI_COMMIT_REF_NAME": "mr-branch",
              "CI_MERGE_REQUEST_IID": "3", "CI_JOB_ID": "55"}  # fmt: skip
    assert ci_tags(gitlab) == {"ci": "gitlab", "commit": "ba5", "branch": "mr-branch", "pr": "3",
                               "ci_job": "55"}  # fmt: skip
    assert ci_tags({"HOME": "/root"}) == {}


def test_models_resolve_to_uploads(tmp_path):
    (tmp_path / "m.py").write_text("class Net: pass\n")
    single = resolve_model(f"{tmp_path / 'm.py'}:Net")
    assert (single.filename, single.entrypoint) == ("m.py", "m.py:Net")
    pkg = tmp_path / "pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text("from .layers import Net\n")
    (pkg / "layers.py").write_text("class Net: pass\n")
    (pkg / "__pycache__" / "x.pyc").write_bytes(b"\0")
    for entry in ("model.py:Net", "pkg/model.py:Net"):  # relative to the dir, or naming it
        zipped = resolve_model(f"{pkg}:{entry}")
        assert (zipped.filename, zipped.entrypoint) == ("pkg.zip", "pkg/model.py:Net")
    names = zipfile.ZipFile(io.BytesIO(zipped.data)).namelist()
    assert sorted(names) == ["pkg/__init__.py", "pkg/layers.py", "pkg/model.py"]
    with pytest.raises(LoadError, match="name the entrypoint"):
        resolve_model(str(tmp_path / "m.py"))
    with pytest.raises(LoadError, match="not a file in"):
        resolve_model(f"{pkg}:missing.py:Net")
    with pytest.raises(LoadError, match="no such file"):
        resolve_model(str(tmp_path / "none.pt2"))


def test_the_current_directory_zips_under_its_own_name(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "mypkg").mkdir(parents=True)
    (repo / "mypkg" / "__init__.py").write_text("")
    (repo / "mypkg" / "model.py").write_text("class Net: pass\n")
    monkeypatch.chdir(repo)
    zipped = resolve_model(".:mypkg/model.py:Net")  # CI runs from the checkout's root
    assert (zipped.filename, zipped.entrypoint) == ("repo.zip", "repo/mypkg/model.py:Net")
    names = zipfile.ZipFile(io.BytesIO(zipped.data)).namelist()
    assert sorted(names) == ["repo/mypkg/__init__.py", "repo/mypkg/model.py"]


def test_inputs_resolve(tmp_path):
    assert resolve_input('{"x": {"shape": [1, 8]}}').spec == '{"x": {"shape": [1, 8]}}'
    (tmp_path / "t.pt").write_bytes(b"PK")
    assert resolve_input(str(tmp_path / "t.pt")).filename == "t.pt"
    with pytest.raises(InputSpecError, match="not valid JSON"):
        resolve_input("{nope")


def test_flag_errors_exit_2(capsys, tmp_path):
    (tmp_path / "m.py").write_text("class Net: pass\n")
    model = f"{tmp_path / 'm.py'}:Net"
    assert main(["submit", model, "--server", "http://127.0.0.1:9", "--max-increase",
                 "params=5%"]) == 2  # fmt: skip
    assert "--max-increase needs a baseline" in capsys.readouterr().err
    assert main(["submit", model, "--server", "ftp://x"]) == 2
    assert main(["submit", model, "--server", "http://127.0.0.1:9", "--no-wait",
                 "--max-params", "1e6"]) == 2  # fmt: skip
    assert "--no-wait cannot check gates" in capsys.readouterr().err
    assert main(["submit", model, "--server", "http://127.0.0.1:9",
                 "--max-graph-breaks", "x"]) == 2  # fmt: skip
    assert "give a whole number" in capsys.readouterr().err
    assert main(["submit", model, "--server", "http://127.0.0.1:9", "--no-ci-tags"]) == 2
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err


BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "numpy", "rich", "fastapi", "sqlalchemy", "server"}:
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, Block())
"""


def test_the_client_needs_only_httpx_and_pydantic():
    """What CI installs (`pip install --no-deps` + httpx, pydantic) is enough to submit."""
    code = BLOCKER + (
        "from inspector.cli import main\n"
        "from inspector.ci.gates import gates_markdown, check_findings\n"
        "import inspector.ci.submit, inspector.ci.client\n"
        "assert gates_markdown([check_findings({}, 'error')]).endswith('All gates passed.**')\n"
        "raise SystemExit(main(['submit', '--help']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--max-train-peak" in done.stdout and "--max-graph-breaks" in done.stdout
