"""Deployment and operations, fast parts: the compose file, /readyz, /metrics, JSON logs,
`inspector gc`, the upload store's quota (507) and `serve` without an embedded worker."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from api_support import MLP_SOURCE, SPEC, database
from conftest import IN_CI
from fastapi.testclient import TestClient
from sqlalchemy import text

from server.app import create_app
from server.gc import GcError, parse_age, run_gc
from server.logs import JsonFormatter, configure_logging, job_context
from server.models import Job, Tag, Upload, utcnow
from server.settings import Settings
from server.storage import UploadStore

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


# --- docker-compose.yml -------------------------------------------------------------------


def _compose(name: str, **env: str) -> subprocess.CompletedProcess:
    binary = shutil.which("docker-compose")
    if binary is None:
        if IN_CI:
            pytest.fail("docker-compose is missing and CI=true requires it (make system-deps)")
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("INSPECTOR_")}
    return subprocess.run(
        [binary, "-f", str(ROOT / name), "config"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=clean | env,
    )  # fmt: skip


def _compose_config(name: str = "docker-compose.yml", **env: str) -> dict:
    yaml = pytest.importorskip("yaml")
    done = _compose(name, **env)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def test_compose_file_is_valid_and_complete():
    services = _compose_config()["services"]
    assert set(services) == {"postgres", "redis", "migrate", "server", "worker"}
    server, worker = services["server"], services["worker"]
    assert server["environment"]["INSPECTOR_EMBEDDED_WORKER"] == "false"
    assert "/readyz" in " ".join(server["healthcheck"]["test"])
    assert server["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["command"] == ["inspector", "db", "upgrade"]
    assert worker["command"] == ["inspector", "worker"]
    assert "container_name" not in worker  # `--scale worker=N` needs unnamed containers
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert "privileged" not in worker and "cap_add" not in worker  # minimal privileges
    assert "seccomp=unconfined" in worker["security_opt"]
    data = [v for v in server["volumes"] if v.startswith("inspector-data:/data")]
    assert data and data == [v for v in worker["volumes"] if v.startswith("inspector-data")]
    assert any("pgdata" in v for v in services["postgres"]["volumes"])
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    same_db = server["environment"]["INSPECTOR_DATABASE_URL"]
    assert worker["environment"]["INSPECTOR_DATABASE_URL"] == same_db
    # Uploads in Postgres by default: workers elsewhere (docker-compose.worker.yml) read them.
    assert server["environment"]["INSPECTOR_BLOB_STORE"] == "database"


def test_compose_worker_for_another_host_needs_only_the_two_urls():
    db, redis = "postgresql://inspector:pw@db-host:5432/inspector", "redis://db-host:6379/0"
    services = _compose_config(
        "docker-compose.worker.yml", INSPECTOR_DATABASE_URL=db, INSPECTOR_REDIS_URL=redis
    )["services"]
    assert set(services) == {"worker"}
    worker = services["worker"]
    env = worker["environment"]
    assert (env["INSPECTOR_DATABASE_URL"], env["INSPECTOR_REDIS_URL"]) == (db, redis)
    assert env["INSPECTOR_QUEUE_NAME"] == "inspector"  # the server's queue, as compose names it
    assert "INSPECTOR_BLOB_STORE" not in env  # the worker reads either backend
    assert worker["command"] == ["inspector", "worker"]
    assert worker["volumes"][0].startswith("worker-data:/data")  # its own, not the server's
    assert "seccomp=unconfined" in worker["security_opt"] and "privileged" not in worker
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia"
    for missing in ("INSPECTOR_DATABASE_URL", "INSPECTOR_REDIS_URL"):
        given = {"INSPECTOR_DATABASE_URL": db, "INSPECTOR_REDIS_URL": redis}
        del given[missing]
        refused = _compose("docker-compose.worker.yml", **given)
        assert refused.returncode != 0 and f"set {missing}" in refused.stderr


# --- /healthz, /readyz, /metrics ------------------------------------------------------------


def _client(url: str, tmp_path: Path, **overrides) -> tuple[TestClient, Settings]:
    options = {"sandbox": "none", "trusted_only": True, "queue_name": "ops-test"} | overrides
    settings = Settings(data_dir=tmp_path / "data", database_url=url, **options)
    return TestClient(create_app(settings)), settings


def _add_job(client: TestClient, status: str, run_s: float | None = None, **cols) -> int:
    factory = client.app.state.session_factory
    now = utcnow()
    with factory() as session:
        values = {"upload_sha256": "a" * 64, "upload_filename": "m.py"} | cols
        job = Job(
            name="m", status=status, upload_kind="py", entrypoint="m.py:Net", options={}, **values
        )
        if run_s is not None:
            job.started_at, job.finished_at = now - dt.timedelta(seconds=run_s), now
        session.add(job)
        session.commit()
        return job.id


@pytest.mark.parametrize("backend", BACKENDS)
def test_readyz_checks_database_queue_and_migrations(backend, tmp_path):
    with database(backend, tmp_path) as url:
        client, _ = _client(url, tmp_path)
        assert client.get("/readyz").json() == {"status": "ready", "database": "ok", "queue": "ok"}
        with client.app.state.engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '0001'"))
        r = client.get("/readyz")
        assert r.status_code == 503 and "inspector db upgrade" in r.json()["database"]
        client.app.state.engine.dispose()


def test_readyz_and_healthz_when_the_database_is_gone(tmp_path):
    client, _ = _client("postgresql+psycopg://nobody@127.0.0.1:1/none", tmp_path)
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["database"].startswith("error: ")
    live = client.get("/healthz")  # liveness: the process answers, the outage is reported
    assert live.status_code == 200 and live.json()["status"] == "degraded"
    assert client.get("/metrics").status_code == 503


def _samples(body: str) -> dict[str, float]:
    lines = [line.rsplit(" ", 1) for line in body.splitlines() if not line.startswith("#")]
    return {name: float(value) for name, value in lines}


@pytest.mark.parametrize("backend", BACKENDS)
def test_metrics_from_the_database_and_queue(backend, tmp_path):
    from server.queue import enqueue_job

    with database(backend, tmp_path) as url:
        client, settings = _client(url, tmp_path)
        for run_s in (0.5, 3, 3, 100):  # buckets: <=1: 1, <=5: 3, <=120: 4
            _add_job(client, "done", run_s)
        _add_job(client, "timed_out", 700, error_kind="timed_out")  # > 600: only +Inf
        _add_job(client, "out_of_memory", 2, error_kind="out_of_memory")
        queued = _add_job(client, "queued")
        enqueue_job(queued, settings)
        r = client.get("/metrics")
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        m = _samples(r.text)
        client.app.state.engine.dispose()
    assert m["inspector_queue_depth"] == 1
    assert m['inspector_jobs{status="done"}'] == 4 and m['inspector_jobs{status="queued"}'] == 1
    assert m['inspector_jobs{status="running"}'] == 0
    bucket = 'inspector_job_duration_seconds_bucket{le="%s"}'
    assert m[bucket % "1.0"] == 1  # the 0.5 s job
    assert m[bucket % "2.5"] == 2  # + the 2 s out-of-memory one
    assert m[bucket % "5.0"] == 4  # + two 3 s jobs
    assert m[bucket % "120.0"] == 5 and m[bucket % "600.0"] == 5
    assert m[bucket % "+Inf"] == 6 == m["inspector_job_duration_seconds_count"]
    assert m["inspector_job_duration_seconds_sum"] == pytest.approx(0.5 + 3 + 3 + 100 + 700 + 2)
    assert m['inspector_sandbox_kills_total{cause="timed_out"}'] == 1
    assert m['inspector_sandbox_kills_total{cause="out_of_memory"}'] == 1
    assert m['inspector_sandbox_kills_total{cause="killed"}'] == 0


# --- logs -----------------------------------------------------------------------------------


def test_json_logs_carry_the_job_id():
    record = logging.LogRecord("server.jobs", logging.INFO, "f.py", 1, "sandbox %s", ("x",), None)
    record.event = "sandbox_start"
    with job_context(42):
        configure_logging("json")
        handler = logging.getLogger().handlers[0]
        assert handler.filter(record)
    data = json.loads(JsonFormatter().format(record))
    assert data["job_id"] == 42 and data["msg"] == "sandbox x" and data["level"] == "INFO"
    assert data["event"] == "sandbox_start" and data["logger"] == "server.jobs"
    configure_logging("text")
    outside = logging.LogRecord("server", logging.INFO, "f.py", 1, "hi", None, None)
    assert logging.getLogger().handlers[0].filter(outside) and outside.job_id is None


def test_worker_logs_one_sandbox_start_per_run(tmp_path, caplog):
    from hostile.kit import add_job, make_settings

    from server.jobs import run_job

    settings = make_settings(tmp_path, sandbox="none")  # refused: no child is started
    job_id = add_job(settings)
    with caplog.at_level(logging.INFO, logger="server.jobs"):
        assert run_job(job_id, settings) == "failed"
    starts = [r for r in caplog.records if getattr(r, "event", None) == "sandbox_start"]
    ends = [r for r in caplog.records if getattr(r, "event", None) == "job_end"]
    assert starts == [] and [(r.job_id, r.status) for r in ends] == [(job_id, "failed")]


# --- inspector gc ---------------------------------------------------------------------------


def _gc_fixture(tmp_path: Path, url: str) -> tuple[Settings, dict[str, int], dict[str, str]]:
    settings = Settings(data_dir=tmp_path / "data", database_url=url, sandbox="none")
    store = UploadStore(settings.data_dir)
    sha = {name: store.put_bytes(name.encode()) for name in ("old", "shared", "tagged", "new")}
    client, _ = _client(url, tmp_path)
    old = utcnow() - dt.timedelta(days=100)
    with client.app.state.session_factory() as session:
        for name, digest in sha.items():
            session.add(Upload(sha256=digest, size_bytes=len(name), filename=name, kind="py"))
        session.commit()
    specs = {  # name: (upload, created, status, tags)
        "old": ("old", old, "done", {}),
        "old_failed": ("shared", old, "failed", {"branch": "feature"}),
        "shared_new": ("shared", utcnow(), "done", {}),
        "main": ("tagged", old, "done", {"branch": "main"}),
        "baseline": ("tagged", old, "done", {"baseline": "true"}),
        "old_running": ("new", old, "running", {}),
    }
    ids = {}
    for name, (upload, created, status, tags) in specs.items():
        ids[name] = _add_job(client, status, upload_sha256=sha[upload], created_at=created)
        with client.app.state.session_factory() as session:
            session.add_all(Tag(job_id=ids[name], key=k, value=v) for k, v in tags.items())
            session.commit()
    client.app.state.engine.dispose()
    return settings, ids, sha


@pytest.mark.parametrize("backend", BACKENDS)
def test_gc_deletes_old_reports_and_unused_uploads_only(backend, tmp_path):
    with database(backend, tmp_path) as url:
        settings, ids, sha = _gc_fixture(tmp_path, url)
        store = UploadStore(settings.data_dir)
        dry = run_gc(settings, older_than=parse_age("90d"), dry_run=True)
        assert sorted(dry.jobs) == sorted([ids["old"], ids["old_failed"]])
        assert dry.uploads == [sha["old"]] and dry.bytes_freed == len("old")
        assert store.exists(sha["old"])  # dry run: nothing deleted
        done = run_gc(settings, older_than=dt.timedelta(days=90))
        assert done.jobs == dry.jobs and done.uploads == dry.uploads
        assert not store.exists(sha["old"])
        assert all(store.exists(sha[n]) for n in ("shared", "tagged", "new"))
        client, _ = _client(url, tmp_path)
        with client.app.state.session_factory() as session:
            left = {j.id for j in session.query(Job)}
            tags = session.query(Tag).count()
            uploads = {u.sha256 for u in session.query(Upload)}
        client.app.state.engine.dispose()
        keep = ("shared_new", "main", "baseline", "old_running")
        assert left == {ids[n] for n in keep} and tags == 2
        assert uploads == {sha["shared"], sha["tagged"], sha["new"]}
        assert run_gc(settings, older_than=dt.timedelta(days=90)).jobs == []  # idempotent


def test_gc_age_parsing_and_command(tmp_path, monkeypatch, capsys):
    assert parse_age("90d") == dt.timedelta(days=90) and parse_age("2w") == dt.timedelta(days=14)
    assert parse_age("12h") == dt.timedelta(hours=12)
    with pytest.raises(GcError, match="e.g. 90d"):
        parse_age("ninety days")
    from inspector.cli import main
    from server.settings import get_settings

    monkeypatch.setenv("INSPECTOR_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    try:
        assert main(["gc", "--older-than", "soon"]) == 2
        assert "--older-than 'soon'" in capsys.readouterr().err
        assert main(["gc", "--older-than", "90d", "--dry-run"]) == 0
        assert "would delete 0 report(s), 0 upload(s)" in capsys.readouterr().out
    finally:
        get_settings.cache_clear()


# --- the upload store's quota -----------------------------------------------------------------


def _upload(client: TestClient, source: bytes) -> object:
    files = {"model": ("model.py", source, "application/octet-stream")}
    return client.post("/api/v1/reports", data={"entrypoint": "model.py:Net", "input": SPEC},
                       files=files)  # fmt: skip


def test_uploads_past_the_quota_get_507_and_nothing_is_lost(tmp_path):
    quota = 2 * len(MLP_SOURCE) + 10  # room for two distinct uploads of this size, not three
    client, settings = _client(f"sqlite:///{tmp_path / 'q.db'}", tmp_path, max_data_bytes=quota)
    from server.db import upgrade_database

    upgrade_database(str(settings.database_url))
    first = _upload(client, MLP_SOURCE)
    second = _upload(client, MLP_SOURCE + b"\n# 2\n"[:4])  # 4 bytes more: 2 * len + 4 <= quota
    assert first.status_code == second.status_code == 201
    again = _upload(client, MLP_SOURCE)  # already stored: costs nothing
    assert again.status_code == 201
    third = _upload(client, MLP_SOURCE + b"# three\n")
    assert third.status_code == 507, third.text
    error = third.json()["error"]
    assert error["code"] == "insufficient_storage" and "inspector gc" in error["message"]
    listed = client.get("/api/v1/reports").json()
    assert listed["total"] == 3 and all(r["status"] == "queued" for r in listed["items"])
    stored = list((settings.data_dir / "uploads").rglob("*"))
    assert len([p for p in stored if p.is_file()]) == 2  # the refused file was not kept
    assert not any((settings.data_dir / "tmp").iterdir())  # nor its staging copy
    client.app.state.engine.dispose()


# --- serve in a compose deployment ------------------------------------------------------------


def test_serve_without_embedded_worker_runs_the_sweep_only(tmp_path):
    from server.cli_commands import _start_worker

    settings = Settings(data_dir=tmp_path / "data", embedded_worker=False, sandbox="none")
    handle = _start_worker(settings)
    try:
        names = [t.name for t in handle.threads]
        assert names == ["inspector-sweeper"]  # no consumer thread: jobs wait for workers
    finally:
        handle.stop(timeout=5)
    assert Settings(embedded_worker="false").embedded_worker is False  # as compose sets it
