"""Presets and Hugging Face config.json uploads through the API.

Checks in the web process (no torch there), the stored job, and the job file the worker
hands the sandboxed child; then, slow, the real worker building the models from their
configs on fake tensors (Mixtral through the API, GPT-2 XL through the upload page).
"""

from __future__ import annotations

import json
import sys

import httpx
import pytest
from api_support import api_env
from pages_server import make_settings

from inspector.schema.presets import PRESETS
from server.jobs import JobSpec, _job_json

SPEC = '{"dims": {"B": 1, "S": 64}}'


def _post(env, **fields):  # noqa: ANN001, ANN003
    files = fields.pop("files", None)
    return env.client.post("/api/v1/reports", data=fields, files=files)


BACKENDS = pytest.mark.parametrize("backend", ["sqlite", "postgres"])


@BACKENDS
def test_a_preset_needs_no_file_and_is_queued(backend, tmp_path, monkeypatch) -> None:
    with api_env(backend, tmp_path, monkeypatch) as env:
        response = _post(env, preset="llama-3-8b", input=SPEC)
        assert response.status_code == 201, response.text
        job = env.job(response.json()["slug"])
        assert (job.upload_kind, job.entrypoint, job.name) == (
            "preset",
            "preset:llama-3-8b",
            "preset:llama-3-8b",
        )
        assert env.enqueued == [job.id]


def test_unknown_preset_and_both_sources_are_refused(tmp_path, monkeypatch) -> None:
    with api_env("sqlite", tmp_path, monkeypatch) as env:
        unknown = _post(env, preset="gpt-9")
        assert unknown.status_code == 422
        assert "llama-3-70b" in unknown.json()["error"]["message"]
        both = _post(env, preset="gpt2", files={"model": ("m.py", b"x = 1\n")})
        assert both.status_code == 422 and "not both" in both.json()["error"]["message"]
        neither = _post(env, input=SPEC)
        assert neither.status_code == 422 and "required" in neither.json()["error"]["message"]
        assert env.enqueued == []


@BACKENDS
def test_config_json_is_checked_and_needs_no_entrypoint(backend, tmp_path, monkeypatch) -> None:
    config = json.dumps(PRESETS["gpt2-xl"].config).encode()
    with api_env(backend, tmp_path, monkeypatch) as env:
        ok = _post(env, files={"model": ("config.json", config)})
        assert ok.status_code == 201, ok.text
        job = env.job(ok.json()["slug"])
        assert (job.upload_kind, job.entrypoint) == ("config", "config.json")
        for body, message in [(b"{nope", "not valid JSON"), (b'{"n_layer": 2}', "model_type")]:
            bad = _post(env, files={"model": ("config.json", body)})
            assert bad.status_code == 422 and message in bad.json()["error"]["message"]
        assert len(env.enqueued) == 1


def test_the_child_is_told_the_preset_or_the_config_path(tmp_path) -> None:
    def job_json(kind: str, filename: str, entry: str) -> dict:
        spec = JobSpec(
            id=1, upload_sha256="0" * 64, upload_filename=filename, upload_kind=kind,
            entrypoint=entry, input_spec=None, input_sha256=None, input_filename=None,
            options={}, created_at=None, started_at=None,
        )  # fmt: skip
        settings = make_settings(tmp_path, device="cpu")
        return json.loads(_job_json(spec, settings))

    assert job_json("preset", "gpt2.preset.json", "preset:gpt2")["model"] == "preset:gpt2"
    assert job_json("config", "config.json", "config.json")["model"] == "upload/config.json"


def test_web_process_does_not_import_torch_for_presets() -> None:
    import subprocess

    code = "import server.api.create, server.pages, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_mixtral_config_through_the_api_and_gpt2_xl_through_the_page(tmp_path) -> None:
    from hostile.server import running_server, wait_final

    from server.sandbox import sandbox_available

    if not sandbox_available()[0]:
        pytest.skip(sandbox_available()[1])
    mixtral = json.dumps(PRESETS["mixtral-8x7b"].config).encode()
    xl = tmp_path / "gpt2-xl-config.json"
    xl.write_text(json.dumps(PRESETS["gpt2-xl"].config))
    with running_server(tmp_path / "data", INSPECTOR_DEVICE="cpu") as url:
        created = httpx.post(
            f"{url}/api/v1/reports",
            files={"model": ("config.json", mixtral)},
            data={"input": '{"dims": {"B": 1, "S": 512}}'},
            timeout=60,
        )
        assert created.status_code == 201, created.text
        slug_xl = _upload_through_the_page(url, xl)
        body = wait_final(url, created.json()["slug"], timeout_s=600)
        assert body["status"] == "done", body.get("error")
        report = body["report"]
        # the published 46.7B parameters, eight experts per layer
        assert report["totals"]["params"] == PRESETS["mixtral-8x7b"].published_params
        assert report["meta"]["fake"] is True and report["meta"]["dims"] == {"B": 1, "S": 512}
        assert report["memory"]["train_peak_bytes"] > report["memory"]["param_bytes"] > 0
        body = wait_final(url, slug_xl, timeout_s=600)
        assert body["status"] == "done", body.get("error")
        assert body["report"]["totals"]["params"] == PRESETS["gpt2-xl"].published_params


def _upload_through_the_page(url: str, path) -> str:  # noqa: ANN001
    from browser_support import chromium

    with chromium() as browser:
        page = browser.new_page()
        page.goto(url + "/")
        page.set_input_files("#model-file", str(path))
        assert page.locator("#entry-field").is_hidden()  # a config needs no entrypoint
        page.click('.tab[data-tab="none"]')
        page.click("#submit")
        page.wait_for_url("**/r/**", timeout=60_000)
        slug = page.url.rstrip("/").rsplit("/", 1)[-1]
    return slug


def test_export_level_is_an_option_of_the_upload(tmp_path, monkeypatch) -> None:
    with api_env("sqlite", tmp_path, monkeypatch) as env:
        default = _post(env, preset="gpt2")
        assert env.job(default.json()["slug"]).options["export"] == "fast"
        full = _post(env, preset="gpt2", export="all")
        assert env.job(full.json()["slug"]).options["export"] == "all"
        bad = _post(env, preset="gpt2", export="everything")
        assert bad.status_code == 422 and "none, fast, all" in bad.json()["error"]["message"]
