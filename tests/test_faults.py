"""Faults in a multi-process deployment (server without embedded worker + `inspector worker`s):
a worker SIGKILLed mid-job, the server killed mid-upload, the upload store full, Redis down
for 10 s, Postgres cut off for 10 s. After each: every accepted upload ends in a final
state, nothing is lost, and the service answers again without help.

The Redis outage uses a private `redis-server` on a free port (the shared one on :6379 is
left alone); the Postgres outage uses a TCP proxy in front of the shared server that the
test stops for 10 s (the shared cluster is never stopped).
"""

from __future__ import annotations

import secrets
import signal
import threading
import time

import httpx
import pytest
from deploy_kit import FINAL, TcpProxy, cluster, private_redis, wait_until
from hostile.kit import TINY_MODEL, fresh_postgres

from server.sandbox import sandbox_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox_available()[0], reason=sandbox_available()[1]),
]
OUTAGE_S = 10


def _upload(url: str, model: bytes = TINY_MODEL, **kw) -> httpx.Response:
    files = {"model": ("model.py", model)}
    return httpx.post(f"{url}/api/v1/reports", files=files, data={"entrypoint": "model.py:Net"},
                      timeout=60, **kw)  # fmt: skip


def _job(url: str, slug: str) -> dict:
    return httpx.get(f"{url}/api/v1/reports/{slug}", timeout=30).json()


def _final(url: str, slug: str, timeout_s: float = 240) -> dict:
    def ended() -> dict | None:
        body = _job(url, slug)
        return body if body["status"] in FINAL else None

    return wait_until(ended, timeout_s, f"report {slug} to end", every_s=0.5)


def _status_code(url: str, path: str) -> int | None:
    try:
        return httpx.get(url + path, timeout=5).status_code
    except httpx.TransportError:
        return None


def test_sigkilled_worker_job_is_retried_by_another_worker(tmp_path):
    fast = {"INSPECTOR_JOB_HEARTBEAT_S": "0.5", "INSPECTOR_JOB_STALE_AFTER_S": "4"}
    with cluster(tmp_path / "data", workers=2, **fast) as c:
        slug = _upload(c.url).json()["slug"]
        running = wait_until(
            lambda: (b := _job(c.url, slug))["status"] == "running" and b, 120, "the job to run"
        )
        started = wait_until(lambda: c.events("sandbox_start"), 30, "the sandbox start")
        victim_pid = int(started[0]["worker"].split(":")[1])
        victim = next(p for p in c.workers if p.pid == victim_pid)
        victim.send_signal(signal.SIGKILL)  # mid-job: its sandboxed child dies with it
        victim.wait(10)
        body = _final(c.url, slug)
        assert running["status"] == "running"
        assert body["status"] == "done", body["error"]
        starts = c.events("sandbox_start")
        assert len(starts) == 2  # ran twice: once on the killed worker, once again
        assert {int(s["worker"].split(":")[1]) for s in starts} == {
            victim_pid,
            next(p.pid for p in c.workers if p is not victim),
        }
        sweeps = [line for line in c.tail("", 1_000_000).splitlines() if "sweep: " in line]
        assert any("'requeued': [1]" in line for line in sweeps)  # by the server or a worker


def _slow_body(size: int, sent: threading.Event):  # noqa: ANN202
    boundary = "b" + secrets.token_hex(8)
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"; filename="model.py"\r\n'
        "Content-Type: text/x-python\r\n\r\n"
    ).encode()

    def chunks():  # noqa: ANN202
        yield head + TINY_MODEL
        for _ in range(size // 65536):
            yield b"#" * 65535 + b"\n"
            sent.set()
            time.sleep(0.05)  # slow enough for the kill to land mid-body

    return boundary, chunks()


def test_server_killed_mid_upload_then_quota(tmp_path):
    quota = str(int(1.5 * len(TINY_MODEL)))  # room for one stored model, not two
    with cluster(tmp_path / "data", workers=1, INSPECTOR_MAX_DATA_BYTES=quota) as c:
        sent, errors = threading.Event(), []
        boundary, body = _slow_body(8 * 1024**2, sent)
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}

        def post() -> None:
            try:
                httpx.post(f"{c.url}/api/v1/reports", content=body, headers=headers, timeout=60)
            except httpx.HTTPError as exc:
                errors.append(exc)

        thread = threading.Thread(target=post)
        thread.start()
        assert sent.wait(30)
        c.kill_server()
        thread.join(60)
        assert errors  # the client saw the connection die: not accepted
        c.start_server()  # the same data dir and database: nothing half-written is visible
        assert httpx.get(f"{c.url}/api/v1/reports", timeout=30).json()["total"] == 0
        assert not list((c.data_dir / "uploads").rglob("*"))
        ok = _upload(c.url)
        full = _upload(c.url, TINY_MODEL + b"# another model\n")
        assert ok.status_code == 201 and full.status_code == 507, full.text
        assert "full" in full.json()["error"]["message"]
        assert _final(c.url, ok.json()["slug"])["status"] == "done"
        assert httpx.get(f"{c.url}/api/v1/reports", timeout=30).json()["total"] == 1


@pytest.mark.redis
def test_redis_down_for_10_s(tmp_path):
    with private_redis() as redis:
        env = {"INSPECTOR_REDIS_URL": redis.url, "INSPECTOR_QUEUE_NAME": "faults"}
        env["INSPECTOR_JOB_LOST_AFTER_S"] = "3"  # queued this long with an empty queue: lost
        with cluster(tmp_path / "data", workers=1, **env) as c:
            before = _upload(c.url).json()["slug"]
            assert _final(c.url, before)["status"] == "done"
            redis.stop()
            down_at = time.monotonic()
            assert _status_code(c.url, "/readyz") == 503
            during = _upload(c.url, TINY_MODEL + b"# during\n")
            assert during.status_code == 201  # the row and file are safe; the queue was not
            assert _status_code(c.url, "/healthz") == 200
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
            redis.start()  # empty: the message for `during` is gone
            wait_until(lambda: _status_code(c.url, "/readyz") == 200, 30, "ready again")
            assert _final(c.url, during.json()["slug"])["status"] == "done"
            after = _upload(c.url, TINY_MODEL + b"# after\n").json()["slug"]
            assert _final(c.url, after)["status"] == "done"


@pytest.mark.postgres
def test_postgres_cut_off_for_10_s(tmp_path, postgres_url):
    from sqlalchemy.engine import make_url

    with fresh_postgres(postgres_url) as db_url:
        url = make_url(db_url)
        proxy = TcpProxy(url.port or 5432)
        proxy.start()
        proxied = url.set(port=proxy.port).render_as_string(hide_password=False)
        env = {"INSPECTOR_DATABASE_URL": proxied, "INSPECTOR_JOB_STALE_AFTER_S": "15"}
        env["INSPECTOR_JOB_HEARTBEAT_S"] = "0.5"
        try:
            with cluster(tmp_path / "data", workers=1, **env) as c:
                slug = _upload(c.url).json()["slug"]
                wait_until(lambda: _job(c.url, slug)["status"] == "running", 120, "running")
                proxy.stop()
                down_at = time.monotonic()
                assert _status_code(c.url, "/readyz") == 503
                assert _status_code(c.url, "/healthz") == 200  # alive, reports the outage
                refused = _status_code(c.url, f"/api/v1/reports/{slug}")
                assert refused is not None and refused >= 500  # an answer, not a hang
                time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
                proxy.start()
                wait_until(lambda: _status_code(c.url, "/readyz") == 200, 30, "ready again")
                assert _final(c.url, slug)["status"] == "done"
                after = _upload(c.url, TINY_MODEL + b"# after\n").json()["slug"]
                assert _final(c.url, after)["status"] == "done"
        finally:
            proxy.stop()
