"""Comparing two reports: `inspector.compare.compare_reports` and the compare endpoints."""

from __future__ import annotations

import pytest
from api_support import BACKENDS, api_env, finish, mlp_report, upload

from inspector.compare import compare_reports, delta, setup_drift
from inspector.report import Module, Report

# hidden 16: fc1 = 8*16 + 16 = 144, fc2 = 16*4 + 4 = 68 -> 212 params
# hidden 32: fc1 = 8*32 + 32 = 288, fc2 = 32*4 + 4 = 132 -> 420 params
A_PARAMS, B_PARAMS = 212, 420


def test_delta():
    assert delta(200, 250) == {"a": 200, "b": 250, "delta": 50, "percent": 25.0, "direction": "up"}
    assert delta(200, 150)["percent"] == -25.0 and delta(200, 150)["direction"] == "down"
    assert delta(7, 7)["direction"] == "same"
    assert delta(0, 5)["percent"] is None  # no percent of nothing
    assert delta(None, 5) == {"a": None, "b": 5, "delta": None, "percent": None, "direction": None}


def test_compare_reports_by_hand():
    a, b = mlp_report(hidden=16), mlp_report(hidden=32, warnings=1)
    b.modules.append(Module(path="fc3", type="Linear", params=5))
    a.modules.append(Module(path="dropout", type="Dropout"))
    diff = compare_reports(a, b)
    params = diff["summary"]["params"]
    # (420 - 212) / 212 = 98.113...%
    assert params == {
        "a": A_PARAMS,
        "b": B_PARAMS,
        "delta": 208,
        "percent": 98.11,
        "direction": "up",
    }
    # flops 2*2*8*16 + 2*2*16*4 = 768 -> 2*2*8*32 + 2*2*32*4 = 1536: +100%
    assert diff["summary"]["flops_forward"]["percent"] == 100.0
    # train peak = 4 * param bytes = 16 * params: 3392 -> 6720
    assert diff["summary"]["train_peak_bytes"]["delta"] == 16 * (B_PARAMS - A_PARAMS)
    assert diff["summary"]["findings_warnings"] == {
        "a": 0,
        "b": 1,
        "delta": 1,
        "percent": None,
        "direction": "up",
    }
    assert diff["summary"]["saved_activation_bytes"]["direction"] is None  # not computed
    modules = diff["modules"]
    assert [m["path"] for m in modules["added"]] == ["fc3"]
    assert [m["path"] for m in modules["removed"]] == ["dropout"]
    changed = {c["path"]: c["changes"] for c in modules["changed"]}
    assert set(changed) == {"", "fc1", "fc2"} and modules["unchanged"] == 0
    assert changed["fc1"]["output_shapes"] == {"a": [["B", 16]], "b": [["B", 32]]}
    assert changed["fc1"]["params"]["delta"] == 288 - 144
    assert "output_shapes" not in changed["fc2"]  # [B, 4] on both sides
    assert [f["rule"] for f in diff["findings"]["added"]] == ["rule-0"]
    assert diff["findings"]["resolved"] == []


def _set_up(
    report: Report,
    torch: str = "2.13.0",
    dtype: str = "float32",
    batch: int = 8,
    device: str = "cpu",
    optimizer: str = "adamw",
) -> Report:
    report.meta.versions = {
        "torch": torch,
        "python": "3.11.9",
        "inspector": "0.1.0",
        "cuda": None,
        "cudnn": None,
        "transformers": "4.57.1",
    }
    report.meta.options = {**report.meta.options, "dtype": dtype, "optimizer": optimizer}
    report.meta.device, report.meta.dims = device, {"B": batch}
    return report  # fmt: skip


def test_setup_drift_names_each_version_or_option_that_differs():
    a = _set_up(mlp_report())
    assert setup_drift(a, _set_up(mlp_report())) == []
    b = _set_up(mlp_report(), torch="2.14.0", dtype="bf16", batch=16, optimizer="sgd")
    assert setup_drift(a, b) == [
        {"key": "torch", "label": "torch", "a": "2.13.0", "b": "2.14.0"},
        {"key": "dtype", "label": "activation dtype", "a": "float32", "b": "bf16"},
        {"key": "optimizer", "label": "optimizer", "a": "adamw", "b": "sgd"},
        {"key": "batch", "label": "batch", "a": 8, "b": 16},
    ]
    gpu = _set_up(mlp_report(), device="cuda")
    gpu.meta.versions.update(cuda="12.8", gpu_name="NVIDIA H200")
    # CPU -> CUDA is the device's drift; the CPU side has no CUDA or GPU to differ
    assert [d["key"] for d in setup_drift(a, gpu)] == ["device"]
    old = mlp_report()  # a report from before meta.versions: its torch_version still counts
    old.meta.torch_version, old.meta.options = "2.12.1", {"dtype": "float32"}
    assert [d["key"] for d in setup_drift(old, a)] == ["torch"]


def test_compare_with_itself_changes_nothing():
    diff = compare_reports(mlp_report(), mlp_report())
    assert diff["drift"] == []
    assert {v["direction"] for v in diff["summary"].values()} <= {"same", None}
    assert diff["modules"]["changed"] == [] and diff["modules"]["unchanged"] == 3


@pytest.fixture(params=BACKENDS)
def env(request, tmp_path, monkeypatch):
    with api_env(request.param, tmp_path, monkeypatch) as env:
        yield env


def test_compare_endpoints(env):
    a = upload(env, data={"name": "small"}).json()["slug"]
    b = upload(env, data={"name": "wide", "tags": "branch=dev"}).json()["slug"]
    finish(env, a, mlp_report(hidden=16))
    finish(env, b, mlp_report(hidden=32))
    by_pair = env.client.get(f"/api/v1/compare/{a}..{b}")
    assert by_pair.status_code == 200, by_pair.text
    by_query = env.client.get("/api/v1/compare", params={"a": a, "b": b})
    assert by_pair.json() == by_query.json()
    body = by_pair.json()
    assert (body["a"]["name"], body["b"]["name"], body["b"]["tags"]) == (
        "small",
        "wide",
        {"branch": "dev"},
    )
    assert body["summary"]["params"]["delta"] == B_PARAMS - A_PARAMS
    assert body["b"]["url"].endswith(f"/r/{b}")
    assert body["drift"] == []


def test_compare_and_markdown_flag_drift(env):
    a = upload(env).json()["slug"]
    b = upload(env).json()["slug"]
    finish(env, a, _set_up(mlp_report(hidden=16)))
    finish(env, b, _set_up(mlp_report(hidden=16), torch="2.14.0", dtype="bf16"))
    body = env.client.get(f"/api/v1/compare/{a}..{b}").json()
    assert [(d["key"], d["a"], d["b"]) for d in body["drift"]] == [
        ("torch", "2.13.0", "2.14.0"), ("dtype", "float32", "bf16")]  # fmt: skip
    text = env.client.get(f"/api/v1/reports/{b}/markdown", params={"baseline": a}).text
    assert "**Set-up differs from the baseline:** torch 2.13.0 → 2.14.0, activation dtype " \
        "float32 → bf16." in text  # fmt: skip
    plain = env.client.get(f"/api/v1/reports/{b}/markdown").text
    assert "Set-up differs" not in plain  # no baseline, nothing to differ from


def test_compare_errors(env):
    a = upload(env).json()["slug"]
    b = upload(env).json()["slug"]
    finish(env, a, mlp_report())
    pending = env.client.get(f"/api/v1/compare/{a}..{b}")
    assert pending.status_code == 409 and b in pending.json()["error"]["message"]
    assert env.client.get(f"/api/v1/compare/{a}..nope").status_code == 404
    assert env.client.get(f"/api/v1/compare/{a}").status_code == 422
    assert env.client.get(f"/api/v1/compare?a={a}").status_code == 422


def test_markdown_with_a_baseline(env):
    a = upload(env).json()["slug"]
    b = upload(env).json()["slug"]
    finish(env, a, mlp_report(hidden=16))
    finish(env, b, mlp_report(hidden=32))
    text = env.client.get(f"/api/v1/reports/{b}/markdown", params={"baseline": a}).text
    assert "(+98.1%)" in text  # (420 - 212) / 212 = 98.11%
