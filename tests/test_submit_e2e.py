"""`inspector submit` (the real CLI, in a subprocess) against a real `inspector serve`:
web server, SQLite, queue, worker and bubblewrap sandbox, with INSPECTOR_AUTH=token.

One server for the module; six real jobs (each a sandboxed child that imports torch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from hostile.server import ROOT, running_server

from server.sandbox import sandbox_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox_available()[0], reason=sandbox_available()[1]),
]

TINY = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, hidden=4):
        super().__init__()
        self.fc = nn.Linear(8, hidden)

    def forward(self, x):
        return self.fc(x).relu()


def wide():
    return Net(hidden=8)


class Scaled(Net):
    def __init__(self):
        super().__init__()
        self.scale = torch.ones(4)  # a plain tensor attribute: the tensor-attribute warning

    def forward(self, x):
        return self.fc(x).relu() * self.scale


class Broken(Net):
    def forward(self, x):
        return self.fc(x.view(3, 5))  # the user's bug: 2 * 8 values do not fit 3 x 5
"""
SPEC = '{"x": {"shape": ["B", 8]}, "dims": {"B": 2}}'
TINY_PARAMS = 8 * 4 + 4  # Linear(8, 4): weight + bias = 36
WIDE_PARAMS = 8 * 8 + 8  # Linear(8, 8) = 72, +100% over TINY
# docs/ci.md: `DIR:model.py:Entry` zips the folder so that relative imports work.
PACKAGE_MODEL = """\
from mypkg.layers import Net

from .layers import wide

__all__ = ["Net", "wide"]
"""
RATE = 8  # uploads per token per minute on this server (token "ci" makes 7)
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "CI_", "GITLAB"))}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**CLEAN_ENV, "PYTHONPATH": str(ROOT), **(env or {})}
    command = [sys.executable, "-m", "inspector.cli", *args]
    return subprocess.run(command, env=full, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("submit")
    data = tmp / "data"
    data.mkdir()
    admin_env = {"INSPECTOR_DATA_DIR": str(data)}
    tokens = {}
    for name in ("ci", "rate", "old"):  # the real `inspector token create`, as an operator runs it
        done = cli("token", "create", name, env=admin_env)
        assert done.returncode == 0, done.stderr
        tokens[name] = done.stdout.strip()
    assert cli("token", "revoke", "old", env=admin_env).returncode == 0
    (tmp / "model.py").write_text(TINY)
    (tmp / "bad.py").write_text("def broken(:\n    pass\n")
    (tmp / "mypkg").mkdir()
    (tmp / "mypkg" / "__init__.py").write_text("")
    (tmp / "mypkg" / "layers.py").write_text(TINY)
    (tmp / "mypkg" / "model.py").write_text(PACKAGE_MODEL)
    env = {"INSPECTOR_AUTH": "token", "INSPECTOR_UPLOAD_RATE_PER_MINUTE": str(RATE)}
    with running_server(data, INSPECTOR_DEVICE="cpu", **env) as url:
        yield {"url": url, "tmp": tmp, "tokens": tokens}


def submit(service, entry: str, *args: str, token: str = "ci", env=None):
    model = str(service["tmp"] / entry)
    base = ["submit", model, "--input", SPEC, "--server", service["url"], "--timeout", "240"]
    if token:
        base += ["--token", service["tokens"][token]]
    return cli(*base, *args, env=env)


def test_pass_tags_from_github_and_outputs(service):
    github = {"GITHUB_ACTIONS": "true", "GITHUB_SHA": "abc123", "GITHUB_REF_NAME": "main",
              "GITHUB_REF": "refs/heads/main", "GITHUB_RUN_ID": "99"}  # fmt: skip
    md, js = service["tmp"] / "pass.md", service["tmp"] / "pass.json"
    done = submit(service, "model.py:Net", "--max-train-peak", "1GiB", "--max-params", "1e6",
                  "--markdown", str(md), "--json", str(js), env=github)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Result: pass" in done.stdout
    assert "[100%]" in done.stderr or "done" in done.stderr  # progress went to stderr
    result = json.loads(js.read_text())
    assert result["figures"]["params"] == TINY_PARAMS
    assert result["figures"]["flops_forward"] == 2 * 2 * 8 * 4  # 2 * B * in * out = 128
    assert result["tags"] == {"ci": "github", "commit": "abc123", "branch": "main", "ci_job": "99"}
    assert [(g["gate"], g["verdict"]) for g in result["gates"]] == [
        ("max train_peak", "pass"), ("max params", "pass"), ("findings", "pass"),
    ]  # fmt: skip
    text = md.read_text()
    assert "| Parameters | 36 |" in text and "All gates passed" in text
    assert result["url"] in text


def test_budget_fails_with_exit_1(service):
    done = submit(service, "model.py:Net", "--no-ci-tags", "--tag", "branch=budget",
                  "--max-params", "10")  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("Parameters"))
    assert row.split()[1:4] == ["36", "≤", "10"] and "FAIL" in row
    assert "Result: FAIL (1 of 2 gates failed)" in done.stdout  # max params + findings


def test_relative_increase_against_tagged_baseline_fails(service):
    md = service["tmp"] / "wide.md"
    done = submit(service, "model.py:wide", "--no-ci-tags", "--tag", "branch=feature",
                  "--baseline", "tag:branch=main", "--max-increase", "params=10%",
                  "--max-increase", "train_peak=1000%", "--markdown", str(md))  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("Parameters vs"))
    # 72 - 36 = +36 parameters = +100.0% of 36, over the +10% allowed
    assert "72 (+36, +100.0%)" in row and "+10%" in row and "FAIL" in row
    text = md.read_text()
    assert "Baseline" in text and "▲ +36 (+100.0%)" in text  # the server's delta column
    assert "❌ **FAIL**" in text and "1 gate(s) failed" in text


def test_warning_finding_fails_with_fail_on_warning(service):
    done = submit(service, "model.py:Scaled", "--no-ci-tags", "--fail-on", "warning")
    assert done.returncode == 1, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("Findings "))
    assert "1 warning" in row and "FAIL" in row


def test_bad_model_exits_2_with_the_error(service):
    failed = submit(service, "model.py:Broken", "--no-ci-tags")
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert "error: the job failed" in failed.stderr and "model.py" in failed.stderr
    refused = submit(service, "bad.py:broken", "--no-ci-tags")  # refused at upload: no job
    assert refused.returncode == 2
    assert "HTTP 422" in refused.stderr and "bad.py:1" in refused.stderr


def test_package_directory_loads_as_a_package(service):
    js = service["tmp"] / "pkg.json"
    done = submit(service, "mypkg:model.py:wide", "--no-ci-tags", "--json", str(js))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(js.read_text())["figures"]["params"] == WIDE_PARAMS  # 72


def test_auth_no_token_and_revoked_token_are_refused(service):
    none = submit(service, "model.py:Net", "--no-ci-tags", token="")
    assert none.returncode == 2 and "HTTP 401" in none.stderr
    assert "authentication required" in none.stderr and "INSPECTOR_TOKEN" in none.stderr
    old = submit(service, "model.py:Net", "--no-ci-tags", token="old")
    assert old.returncode == 2 and "HTTP 401" in old.stderr and "revoked" in old.stderr


def test_rate_limit_gives_429_with_retry_after(service):
    headers = {"Authorization": f"Bearer {service['tokens']['rate']}"}
    files = {"model": ("bad.py", b"def broken(:\n")}
    data = {"entrypoint": "bad.py:broken"}
    url = f"{service['url']}/api/v1/reports"
    codes = [httpx.post(url, headers=headers, files=files, data=data, timeout=30).status_code
             for _ in range(RATE)]  # fmt: skip
    assert codes == [422] * RATE  # every attempt counts, accepted or not
    limited = httpx.post(url, headers=headers, files=files, data=data, timeout=30)
    assert limited.status_code == 429
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert limited.json()["error"]["code"] == "rate_limited"
    # Reading stays open, by the unguessable link; listing needs a token.
    assert httpx.get(f"{service['url']}/api/v1/reports", timeout=30).status_code == 401
