"""The `inspector` command line: flags, exit codes, `--json -` keeping stdout clean,
lazy dispatch to the server commands, and (slow) the real CLI on a real model file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from inspector import cli
from inspector.errors import InputSpecError, LoadError
from inspector.report import Module, Report, Totals

ROOT = Path(__file__).resolve().parent.parent


def fake_report() -> Report:
    return Report(
        modules=[Module(path="", type="Net", params=212, output_shapes=[["B", 4]])],
        totals=Totals(params=212, trainable_params=212, flops_forward=1_696),
    )


@pytest.fixture
def fake_pipeline(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Replace `inspect_model` with one that records its call and chatters on stdout,
    as user models do (a Python print and a C-level write to fd 1)."""
    calls: list[tuple] = []

    def inspect_model(model, spec, options, progress):  # noqa: ANN001, ANN202
        calls.append((model, spec, options))
        print("hello from the model")
        os.write(1, b"C-level chatter\n")
        return fake_report()

    monkeypatch.setattr(cli, "_pipeline", lambda: inspect_model)
    return calls


# -- parsing and exit codes -------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "m.py:f", "--bogus"],
        ["inspect", "m.py:f", "--budget", "lots"],
        ["inspect", "m.py:f", "--depth", "-1"],
        ["inspect", "m.py:f", "--optimizer", "lion"],
        ["inspect"],
        [],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inspect", "--help"]) == 0
    assert "--optimizer" in capsys.readouterr().out


def test_options_from_flags(fake_pipeline: list[tuple]) -> None:
    argv = ["inspect", "m.py:f", "--fake", "--optimizer", "sgd", "--dtype", "bf16"]
    argv += ["--budget", "20GiB", "--budget", "16GB", "--depth", "2", "--seed", "7"]
    argv += ["--no-measure", "--device", "cpu", "--json", os.devnull]
    assert cli.main(argv) == 0
    (model, spec, options) = fake_pipeline[0]
    assert (model, spec) == ("m.py:f", None)
    assert options.fake and options.optimizer == "sgd" and options.dtype == "bf16"
    assert options.budgets_bytes == [20 * 2**30, 16 * 10**9]
    assert (options.depth, options.seed, options.measure, options.device) == (2, 7, False, "cpu")


def test_unknown_pass_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inspect", "m.py:f", "--passes", "graph,nosuch"]) == 2
    err = capsys.readouterr().err
    assert "error: --passes: unknown pass nosuch" in err and "hint: The passes are: " in err


# -- --input ----------------------------------------------------------------------------


def test_input_json_text_passes_through() -> None:
    spec = '{"x": {"shape": ["B", 8]}, "dims": {"B": 4}}'
    assert cli.read_input_arg(spec) == spec
    assert cli.read_input_arg(None) is None


def test_input_json_file_is_read_as_a_spec(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text('[{"shape": [8, 16]}]')
    assert cli.read_input_arg(str(path)) == '[{"shape": [8, 16]}]'


def test_input_tensor_file_path_passes_through(tmp_path: Path) -> None:
    # The loader checks tensor files: it can suggest a spec that fits the model.
    path = str(tmp_path / "x.pt")
    assert cli.read_input_arg(path) == path


def test_input_json_file_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InputSpecError, match="cannot read the input spec file"):
        cli.read_input_arg(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "x": {"shape": [8,]}\n}')
    with pytest.raises(InputSpecError, match=r"bad.json:2: not valid JSON"):
        cli.read_input_arg(str(bad))
    assert cli.main(["inspect", "m.py:f", "--input", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}:2: not valid JSON") and "Traceback" not in err


# -- errors from the pipeline -----------------------------------------------------------


def test_user_error_exits_2_with_location_and_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def inspect_model(*args: object) -> Report:
        raise LoadError("entrypoint 'make' not found", location="model.py:3", hint="Use Net.")

    monkeypatch.setattr(cli, "_pipeline", lambda: inspect_model)
    assert cli.main(["inspect", "model.py:make"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "error: model.py:3: entrypoint 'make' not found\nhint: Use Net.\n"
    assert captured.out == ""


def test_unexpected_exception_is_an_internal_error_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def inspect_model(*args: object) -> Report:
        raise RuntimeError("boom in a pass")

    monkeypatch.setattr(cli, "_pipeline", lambda: inspect_model)
    assert cli.main(["inspect", "model.py:make"]) == 1
    err = capsys.readouterr().err
    assert "internal error" in err and "Traceback" in err and "RuntimeError: boom" in err


# -- output -----------------------------------------------------------------------------


def test_json_dash_writes_only_json_to_stdout(
    fake_pipeline: list[tuple], capfd: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["inspect", "m.py:f", "--json", "-"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["totals"]["params"] == 212
    assert "hello from the model" in err and "C-level chatter" in err
    assert "Model Graph Inspector" not in out  # no tables on stdout


def test_json_path_writes_file_and_prints_tables(
    fake_pipeline: list[tuple], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "report.json"
    assert cli.main(["inspect", "m.py:f", "--json", str(target)]) == 0
    assert Report.from_json(target.read_text()).totals.params == 212
    out = capsys.readouterr().out
    assert "Total" in out and "212" in out and f"report written to {target}" in out


def test_json_path_unwritable_is_a_user_error(
    fake_pipeline: list[tuple], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "no" / "such" / "dir" / "r.json"
    assert cli.main(["inspect", "m.py:f", "--json", str(target)]) == 2
    assert "error: cannot write the report to" in capsys.readouterr().err


# -- server commands --------------------------------------------------------------------


def test_server_commands_dispatch_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple] = []
    fake = types.ModuleType("server.cli_commands")
    fake.serve = lambda host, port: calls.append(("serve", host, port)) or 0
    fake.worker = lambda: calls.append(("worker",)) or 0
    fake.db_upgrade = lambda: calls.append(("db_upgrade",)) or 3
    monkeypatch.setitem(sys.modules, "server.cli_commands", fake)
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "9000"]) == 0
    assert cli.main(["worker"]) == 0
    assert cli.main(["db", "upgrade"]) == 3  # the command's status is the exit status
    assert calls == [("serve", "0.0.0.0", 9000), ("worker",), ("db_upgrade",)]


def test_without_the_server_package_its_commands_are_absent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: [])  # no package registered any
    assert cli.main(["worker"]) == 2  # argparse's usage error
    assert "invalid choice: 'worker'" in capsys.readouterr().err


def test_cli_import_pulls_in_neither_torch_nor_the_server_stack() -> None:
    code = (
        "import sys; from inspector.cli import build_parser; build_parser(); "
        "bad = [m for m in ('torch', 'fastapi', 'sqlalchemy') if m in sys.modules]; "
        "sys.exit(str(bad) if bad else 0)"
    )
    result = run_python(["-c", code])
    assert result.returncode == 0, result.stderr


# -- the real CLI on a real model (needs loading + capture + the graph pass) -------------


def run_python(args: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="160")
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


MLP = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        print("forward ran")  # user code printing must not spoil --json -
        return self.fc2(torch.relu(self.fc1(x)))
"""
SPEC = '{"x": {"shape": ["B", 8]}, "dims": {"B": 4}}'


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.py"
    path.write_text(textwrap.dedent(MLP))
    return path


@pytest.mark.slow
def test_real_cli_json_to_stdout(model_file: Path) -> None:
    result = run_python(
        ["-m", "inspector.cli", "inspect", f"{model_file}:Net", "--input", SPEC, "--json", "-"]
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # stdout is the JSON and nothing else
    # fc1: 8 * 16 + 16 = 144; fc2: 16 * 4 + 4 = 68; 144 + 68 = 212
    assert report["totals"]["params"] == 212
    fc1 = next(m for m in report["modules"] if m["path"] == "fc1")
    assert fc1["output_shapes"] == [["B", 16]]


def test_real_pipeline_tables_and_json_file(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "r.json"
    argv = ["inspect", f"{model_file}:Net", "--input", SPEC, "--json", str(target)]
    assert cli.main([*argv, "--passes", "graph"]) == 0  # the other passes: the slow test
    out = capsys.readouterr().out
    assert "[B, 16]" in out and "fc2" in out and "forward ran" in out
    total = next(line for line in out.splitlines() if line.startswith("Total"))
    assert "212" in total  # 144 + 68, as above
    assert Report.from_json(target.read_text()).totals.params == 212


@pytest.mark.slow
def test_real_cli_on_a_package(tmp_path: Path) -> None:
    pkg = tmp_path / "repo" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text(textwrap.dedent(MLP))
    (pkg / "model.py").write_text(
        "from .layers import Net as _Net\n\n\nclass Net(_Net):\n    pass\n"
    )
    model = f"{pkg / 'model.py'}:Net"
    result = run_python(
        ["-m", "inspector.cli", "inspect", model, "--input", SPEC, "--json", "-"], cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["totals"]["params"] == 212  # 144 + 68, as above
    assert report["meta"]["entrypoint"] == "Net"


@pytest.mark.slow
def test_real_cli_missing_model_file_exits_2(tmp_path: Path) -> None:
    result = run_python(["-m", "inspector.cli", "inspect", "missing.py:Net"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and "missing.py" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize(
    ("model", "spec", "expected"),
    [
        ("{model}:Nope", SPEC, "Nope"),
        ("{model}:Net", '{"x": {"shape": "oops"}}', "shape"),
        ("{model}:Net", '{"x": {"shape": [4, 8]', "JSON"),
        ("{model}:Net", "no/such/x.safetensors", "x.safetensors"),
    ],
)
def test_user_errors_from_the_real_pipeline_exit_2(
    model_file: Path, model: str, spec: str, expected: str, capfd: pytest.CaptureFixture[str]
) -> None:
    # In-process (torch imported once): the real loader and spec parser, no stubs.
    argv = ["inspect", model.format(model=model_file), "--input", spec, "--json", "-"]
    assert cli.main(argv) == 2
    out, err = capfd.readouterr()
    assert err.startswith("error: ") and expected in err
    assert "Traceback" not in err and out == ""
