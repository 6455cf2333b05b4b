"""API v1 through the real app on SQLite and on Postgres: upload, status, list, Markdown,
re-run, delete, errors; and the same answers from both databases."""

from __future__ import annotations

import subprocess
import sys

import pytest
from api_support import BACKENDS, MLP_SOURCE, api_env, fake_queue, finish, mlp_report, upload
from sqlalchemy import func, select

from server.models import Tag

# MLP: fc1 = 8*16 + 16 = 144, fc2 = 16*4 + 4 = 68 -> 212 params
MLP_PARAMS = 212
# 2 * B * in * out per Linear at B = 2: 2*2*8*16 + 2*2*16*4 = 512 + 256
MLP_FLOPS = 768


@pytest.fixture(params=BACKENDS)
def env(request, tmp_path, monkeypatch):
    with api_env(request.param, tmp_path, monkeypatch) as env:
        yield env


def test_upload_is_stored_and_queued(env):
    r = upload(env, data={"name": "mlp", "tags": "branch=main,commit=abc123", "budget": "24GiB"})
    assert r.status_code == 201, r.text
    body = r.json()
    slug = body["slug"]
    assert body["status"] == "queued"
    assert body["url"].endswith(f"/r/{slug}")
    assert body["api_url"].endswith(f"/api/v1/reports/{slug}")
    job = env.job(slug)
    assert (job.status, job.name, job.entrypoint, job.upload_kind) == (
        "queued",
        "mlp",
        "model.py:Net",
        "py",
    )
    assert job.tag_dict == {"branch": "main", "commit": "abc123"}
    assert job.options["budgets_bytes"] == [24 * 1024**3]
    assert job.options["optimizer"] == "adamw"
    assert job.input_spec is not None and '"B": 2' in job.input_spec
    stored = env.settings.data_dir / "uploads" / job.upload_sha256[:2] / job.upload_sha256[2:]
    assert stored.read_bytes() == MLP_SOURCE
    assert env.enqueued == [job.id]


def test_status_while_queued_then_done(env):
    slugs = [upload(env).json()["slug"] for _ in range(3)]
    positions = [env.client.get(f"/api/v1/reports/{s}").json()["queue_position"] for s in slugs]
    assert positions == [1, 2, 3]
    finish(env, slugs[0], mlp_report())
    got = env.client.get(f"/api/v1/reports/{slugs[0]}").json()
    assert got["status"] == "done" and got["queue_position"] is None
    assert got["report"]["totals"]["params"] == MLP_PARAMS
    assert (got["params"], got["flops_forward"]) == (MLP_PARAMS, MLP_FLOPS)
    assert env.client.get(f"/api/v1/reports/{slugs[1]}").json()["queue_position"] == 1
    for key in ("slug", "status", "stage", "progress", "created_at", "error", "name", "tags"):
        assert key in got


def test_failed_job_shows_its_error(env):
    slug = upload(env).json()["slug"]
    error = {"kind": "user_error", "message": "boom", "stage": "load", "traceback": "model.py:3"}
    finish(
        env, slug, status="failed", error_kind="user_error", error_message="boom", error_json=error
    )
    got = env.client.get(f"/api/v1/reports/{slug}").json()
    assert got["status"] == "failed" and got["error"] == error and got["report"] is None


def test_list_filters_and_pages(env):
    a = upload(env, data={"name": "ResNet small", "tags": "branch=main"}).json()["slug"]
    b = upload(env, data={"name": "gpt tiny", "tags": ["branch=dev", "commit=1"]}).json()["slug"]
    c = upload(env, data={"name": "resnet big", "tags": "branch=dev"}).json()["slug"]
    finish(env, b, mlp_report(warnings=2))
    page = env.client.get("/api/v1/reports").json()
    assert [i["slug"] for i in page["items"]] == [c, b, a]  # newest first
    assert page["total"] == 3 and page["next_offset"] is None

    def slugs(query: str) -> list[str]:
        return [i["slug"] for i in env.client.get(f"/api/v1/reports?{query}").json()["items"]]

    assert slugs("name=RESNET") == [c, a]
    assert slugs("tag=branch=dev") == [c, b]
    assert slugs("tag=branch=dev&tag=commit=1") == [b]
    assert slugs("status=done") == [b]
    assert slugs("status=queued,failed") == [c, a]
    first = env.client.get("/api/v1/reports?limit=2").json()
    assert [i["slug"] for i in first["items"]] == [c, b] and first["next_offset"] == 2
    assert slugs("limit=2&offset=2") == [a]
    row = next(i for i in page["items"] if i["slug"] == b)
    assert (row["params"], row["findings_warnings"], row["findings_errors"]) == (MLP_PARAMS, 2, 0)
    bad = env.client.get("/api/v1/reports?status=finished")
    assert bad.status_code == 422 and "finished" in bad.json()["error"]["message"]


def test_name_filter_treats_percent_literally(env):
    upload(env, data={"name": "100% width"})
    upload(env, data={"name": "1000 width"})
    items = env.client.get("/api/v1/reports", params={"name": "100%"}).json()["items"]
    assert [i["name"] for i in items] == ["100% width"]


def test_markdown(env):
    slug = upload(env, data={"name": "mlp"}).json()["slug"]
    early = env.client.get(f"/api/v1/reports/{slug}/markdown")
    assert early.status_code == 409 and early.json()["error"]["code"] == "not_done"
    finish(env, slug, mlp_report())
    r = env.client.get(f"/api/v1/reports/{slug}/markdown")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/markdown")
    assert "212" in r.text  # params, below 1000 so printed as is
    assert f"/r/{slug}" in r.text


def test_rerun_makes_a_new_job_from_the_same_upload(env):
    old = upload(env, data={"tags": "branch=main"}).json()["slug"]
    assert env.client.post(f"/api/v1/reports/{old}/rerun").status_code == 409  # still queued
    finish(env, old, status="timed_out", error_kind="timed_out")
    r = env.client.post(f"/api/v1/reports/{old}/rerun")
    assert r.status_code == 201, r.text
    new = r.json()["slug"]
    assert new != old
    a, b = env.job(old), env.job(new)
    assert (b.status, b.upload_sha256, b.entrypoint) == ("queued", a.upload_sha256, a.entrypoint)
    assert b.tag_dict == {"branch": "main"} and env.enqueued[-1] == b.id


def test_rerun_of_a_lost_upload_is_gone(env):
    slug = upload(env).json()["slug"]
    finish(env, slug, status="failed")
    job = env.job(slug)
    (env.settings.data_dir / "uploads" / job.upload_sha256[:2] / job.upload_sha256[2:]).unlink()
    r = env.client.post(f"/api/v1/reports/{slug}/rerun")
    assert r.status_code == 410 and r.json()["error"]["code"] == "gone"


def test_delete(env):
    slug = upload(env, data={"tags": "a=1,b=2"}).json()["slug"]
    assert env.client.delete(f"/api/v1/reports/{slug}").status_code == 204
    assert env.client.get(f"/api/v1/reports/{slug}").status_code == 404
    with env.factory() as session:
        assert session.scalar(select(func.count(Tag.id))) == 0  # tags went with the job
    assert env.client.delete(f"/api/v1/reports/{slug}").status_code == 404


def test_errors_have_one_shape(env):
    cases = [
        (env.client.get("/api/v1/reports/nope"), 404, "not_found"),
        (env.client.put("/api/v1/reports"), 405, "method_not_allowed"),
        (env.client.get("/api/v1/no-such-thing"), 404, "not_found"),
        (env.client.post("/api/v1/reports", data={"entrypoint": "x"}), 422, "invalid"),
        (env.client.get("/api/v1/reports?limit=0"), 422, "invalid"),
    ]
    for response, status, code in cases:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] == code and error["message"], error
    missing = cases[3][0].json()["error"]
    assert missing["message"] == "a model file (or a preset name) is required"


def test_healthz(env):
    r = env.client.get("/healthz")
    assert r.status_code == 200
    assert r.json()["database"] == "ok" and r.json()["trusted_only"] is True


def test_failed_enqueue_keeps_the_job_queued(tmp_path, monkeypatch):
    with api_env("sqlite", tmp_path, monkeypatch) as env:
        fake_queue(monkeypatch, env.enqueued, fail=True)
        r = upload(env)
        assert r.status_code == 201
        assert env.job(r.json()["slug"]).status == "queued"


def test_no_sandbox_refuses_uploads(tmp_path, monkeypatch):
    with api_env("sqlite", tmp_path, monkeypatch, trusted_only=False) as env:
        r = upload(env)
        assert r.status_code == 503
        assert "INSPECTOR_TRUSTED_ONLY" in r.json()["error"]["message"]
        assert env.client.get("/api/v1/reports").json()["total"] == 0
        assert not (env.settings.data_dir / "uploads").exists()
        assert env.client.get("/healthz").json()["sandbox"] == "unavailable"


def test_broken_bwrap_refuses_uploads(tmp_path, monkeypatch):
    import server.sandbox

    monkeypatch.setattr(
        server.sandbox,
        "sandbox_available",
        lambda: (False, "user namespaces are disabled"),
        raising=False,
    )
    with api_env("sqlite", tmp_path, monkeypatch, sandbox="bwrap", trusted_only=False) as env:
        r = upload(env)
        assert r.status_code == 503
        assert "user namespaces are disabled" in r.json()["error"]["message"]


def _scenario(env) -> list:
    """A fixed sequence of calls; answers with slugs and times replaced by stable names."""
    slugs = [upload(env, data={"name": f"m{i}", "tags": f"i={i}"}).json()["slug"] for i in range(3)]
    finish(env, slugs[0], mlp_report())
    finish(env, slugs[1], mlp_report(hidden=32, warnings=1))
    finish(env, slugs[2], status="failed", error_json={"kind": "user_error", "message": "x"})
    calls = [f"/api/v1/reports/{s}" for s in slugs] + [
        "/api/v1/reports", "/api/v1/reports?status=done&limit=1", "/api/v1/reports?tag=i=1",
        f"/api/v1/compare/{slugs[0]}..{slugs[1]}", f"/api/v1/reports/{slugs[1]}/markdown",
    ]  # fmt: skip
    answers = [env.client.get(c) for c in calls]
    text = "\n".join(f"{a.status_code} {a.text}" for a in answers)
    for i, slug in enumerate(slugs):
        text = text.replace(slug, f"<slug{i}>")
    return [_without_times(line) for line in text.splitlines()]


def _without_times(line: str) -> str:
    import re

    return re.sub(r'"(created|finished|started)_at":"[^"]*"', r'"\1_at":"T"', line)


@pytest.mark.postgres
def test_sqlite_and_postgres_answer_the_same(tmp_path, monkeypatch):
    answers = {}
    for backend in BACKENDS:
        with api_env(backend, tmp_path / backend, monkeypatch) as env:
            answers[backend] = _scenario(env)
    assert len(answers["sqlite"]) > 8
    for got_sqlite, got_postgres in zip(answers["sqlite"], answers["postgres"], strict=True):
        if got_sqlite.startswith("200 {"):  # JSONB orders keys its own way: compare parsed
            import json

            got_sqlite = json.loads(got_sqlite[4:])
            got_postgres = json.loads(got_postgres[4:])
        assert got_sqlite == got_postgres


def test_web_process_does_not_import_torch(tmp_path):
    code = (
        "import sys; from server.app import create_app; from server.settings import Settings;"
        f"create_app(Settings(data_dir={str(tmp_path)!r})); import inspector.compare;"
        "import inspector.render.markdown; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_bug_is_a_500_without_a_traceback(tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    with api_env("sqlite", tmp_path, monkeypatch) as env:
        app = env.client.app

        @app.get("/api/v1/boom")
        def boom() -> None:
            raise RuntimeError("secret internals")

        r = TestClient(app, raise_server_exceptions=False).get("/api/v1/boom")
        assert r.status_code == 500
        assert r.json()["error"]["code"] == "internal"
        assert "secret" not in r.text and "Traceback" not in r.text


def test_openapi_documents_the_api(tmp_path, monkeypatch):
    with api_env("sqlite", tmp_path, monkeypatch) as env:
        schema = env.client.get("/openapi.json").json()
    paths = schema["paths"]
    assert {
        "/api/v1/reports",
        "/api/v1/reports/{slug}",
        "/api/v1/compare/{pair}",
        "/healthz",
    } <= set(paths)
    create = paths["/api/v1/reports"]["post"]
    assert {"201", "413", "422", "503"} <= set(create["responses"])
    assert "ReportDetail" in schema["components"]["schemas"]
