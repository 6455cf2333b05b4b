"""run_job with the real sandbox and pipeline; the queue; the sweep of dead workers' jobs."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hostile.kit import add_job, fresh_postgres, get_job, make_settings
from sqlalchemy import update

from server.db import session_scope
from server.jobs import run_job, session_factory_for
from server.models import Job, utcnow
from server.queue import enqueue_job, get_huey, job_id_of
from server.sandbox import sandbox_available
from server.storage import UploadStore
from server.worker import MAX_ATTEMPTS, run_worker, start_embedded_worker, sweep

needs_sandbox = pytest.mark.skipif(not sandbox_available()[0], reason=sandbox_available()[1])

RAISING_MODEL = b"""import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        raise ValueError("bad width 7")  # line 8
"""


def _set(settings, job_id: int, **values) -> None:
    with session_scope(session_factory_for(str(settings.database_url))) as session:
        session.execute(update(Job).where(Job.id == job_id).values(**values))


def _assert_tiny_model_done(settings, job_id: int) -> None:
    job = get_job(settings, job_id)
    assert (job.status, job.stage, job.progress, job.attempts) == ("done", "done", 100, 1)
    assert job.params == 8 * 4 + 4  # Linear(8, 4): weight + bias
    assert job.flops_forward == 2 * 2 * 8 * 4  # 2 * B * in * out, B = 2
    assert job.report_json["status"] == "done" and job.error_kind is None
    assert job.started_at <= job.finished_at and job.heartbeat_at is not None
    timings = job.report_json["meta"]["timings_s"]
    assert {"queue_wait", "sandbox_start", "import", "child"} <= set(timings)
    assert not any((settings.data_dir / "jobs").iterdir())  # job dir removed
    assert UploadStore(settings.data_dir).exists(job.upload_sha256)  # upload kept


@needs_sandbox
def test_run_job_done_on_sqlite(tmp_path):
    settings = make_settings(tmp_path)
    job_id = add_job(settings)
    assert run_job(job_id, settings) == "done"
    _assert_tiny_model_done(settings, job_id)


@needs_sandbox
@pytest.mark.postgres
@pytest.mark.slow
def test_run_job_done_on_postgres(tmp_path, postgres_url):
    with fresh_postgres(postgres_url) as url:
        settings = make_settings(tmp_path, database_url=url)
        job_id = add_job(settings)
        assert run_job(job_id, settings) == "done"
        _assert_tiny_model_done(settings, job_id)


@needs_sandbox
def test_user_error_shows_the_users_frames(tmp_path):
    settings = make_settings(tmp_path)
    job_id = add_job(settings, RAISING_MODEL)
    assert run_job(job_id, settings) == "failed"
    job = get_job(settings, job_id)
    assert job.error_kind == "user_error" and "bad width 7" in job.error_message
    trace = job.error_json["traceback"]
    assert 'model.py", line 8' in trace and "/inspector/" not in trace  # theirs, not ours
    assert job.report_json["status"] == "failed"
    assert job.report_json["error"]["kind"] == "user_error"


def test_only_a_queued_job_is_claimed(tmp_path):
    settings = make_settings(tmp_path)
    job_id = add_job(settings)
    _set(settings, job_id, status="done", attempts=1)
    assert run_job(job_id, settings) is None
    assert get_job(settings, job_id).attempts == 1  # untouched


def test_without_a_sandbox_the_worker_refuses(tmp_path):
    settings = make_settings(tmp_path, sandbox="none")  # and not trusted-only
    job_id = add_job(settings)
    assert run_job(job_id, settings) == "failed"
    job = get_job(settings, job_id)
    assert "INSPECTOR_SANDBOX=none" in job.error_message and job.report_json["status"] == "failed"


@needs_sandbox
def test_stopping_the_worker_puts_the_job_back(tmp_path):
    settings = make_settings(tmp_path)
    job_id = add_job(settings)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    assert run_job(job_id, settings, should_stop=stop.is_set) == "queued"
    job = get_job(settings, job_id)
    assert (job.status, job.attempts, job.worker_id) == ("queued", 0, None)
    assert job_id_of(get_huey(settings).dequeue()) == job_id  # queued again


def test_sqlite_queue_round_trip(tmp_path):
    settings = make_settings(tmp_path)
    enqueue_job(41, settings)
    huey = get_huey(settings)
    assert huey.pending_count() == 1
    assert job_id_of(huey.dequeue()) == 41
    assert (settings.data_dir / "queue.db").exists()


@pytest.mark.redis
def test_redis_queue_round_trip(tmp_path, redis_url):
    settings = make_settings(tmp_path, redis_url=redis_url)  # unique queue_name per test
    huey = get_huey(settings)
    try:
        assert type(huey).__name__ == "RedisHuey"
        enqueue_job(7, settings)
        enqueue_job(8, settings)
        assert huey.pending_count() == 2
        assert [job_id_of(huey.dequeue()), job_id_of(huey.dequeue())] == [7, 8]
    finally:
        huey.storage.flush_all()


def test_sweep_retries_a_dead_workers_job_once_then_fails_it(tmp_path):
    settings = make_settings(tmp_path, job_stale_after_s=30)
    job_id = add_job(settings)
    old = utcnow() - dt.timedelta(seconds=31)
    _set(settings, job_id, status="running", attempts=1, heartbeat_at=old, worker_id="gone:1")
    assert sweep(settings)["requeued"] == [job_id]
    assert get_job(settings, job_id).status == "queued"
    assert job_id_of(get_huey(settings).dequeue()) == job_id

    _set(settings, job_id, status="running", attempts=MAX_ATTEMPTS, heartbeat_at=old)
    assert sweep(settings)["failed"] == [job_id]
    job = get_job(settings, job_id)
    assert (job.status, job.error_kind) == ("failed", "worker_lost")
    assert "stopped responding" in job.error_message and "re-run" in job.error_message


def test_sweep_leaves_fresh_heartbeats_alone(tmp_path):
    settings = make_settings(tmp_path, job_stale_after_s=30)
    job_id = add_job(settings)
    recent = utcnow() - dt.timedelta(seconds=5)
    _set(settings, job_id, status="running", attempts=1, heartbeat_at=recent)
    assert sweep(settings) == {"requeued": [], "failed": [], "lost": []}
    assert get_job(settings, job_id).status == "running"


def test_sweep_requeues_a_queued_job_whose_message_was_lost(tmp_path):
    settings = make_settings(tmp_path)
    lost = add_job(settings)
    new = add_job(settings)
    _set(settings, lost, created_at=utcnow() - dt.timedelta(minutes=5))
    assert sweep(settings)["lost"] == [lost]  # the new one may still be on its way
    huey = get_huey(settings)
    assert job_id_of(huey.dequeue()) == lost
    enqueue_job(new, settings)
    _set(settings, new, created_at=utcnow() - dt.timedelta(minutes=5))
    assert sweep(settings)["lost"] == []  # the queue is not empty: it may be waiting there


@needs_sandbox
@pytest.mark.slow
def test_embedded_worker_runs_queued_jobs_and_stops(tmp_path):
    settings = make_settings(tmp_path)
    job_id = add_job(settings)
    enqueue_job(job_id, settings)
    handle = start_embedded_worker(settings)
    try:
        assert handle.refusal is None and handle.alive
        deadline = dt.datetime.now() + dt.timedelta(seconds=120)
        while get_job(settings, job_id).status in ("queued", "running"):
            assert dt.datetime.now() < deadline, "the job did not finish"
            threading.Event().wait(0.2)
    finally:
        handle.stop()
    assert not handle.alive
    _assert_tiny_model_done(settings, job_id)


def _wait_final(settings, job_id: int, timeout_s: float = 180) -> Job:
    deadline = time.monotonic() + timeout_s
    while (job := get_job(settings, job_id)).status in ("queued", "running"):
        assert time.monotonic() < deadline, "the job did not finish"
        time.sleep(0.2)
    return job


def test_worker_command_refuses_without_a_sandbox(tmp_path, capsys):
    settings = make_settings(tmp_path, sandbox="none")
    assert run_worker(settings) == 2
    assert "refusing to run uploads" in capsys.readouterr().err


@needs_sandbox
@pytest.mark.slow
def test_worker_process_runs_a_job_and_stops_on_sigterm(tmp_path):
    settings = make_settings(tmp_path)
    job_id = add_job(settings)
    enqueue_job(job_id, settings)
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "INSPECTOR_DATA_DIR": str(settings.data_dir)}
    env.update(INSPECTOR_QUEUE_NAME=settings.queue_name, INSPECTOR_DEVICE="cpu")
    code = "from server.cli_commands import worker; raise SystemExit(worker())"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    try:
        assert _wait_final(settings, job_id).status == "done"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert b"Traceback" not in proc.stderr.read()


@pytest.mark.slow
def test_trusted_only_mode_runs_unconfined(tmp_path):
    settings = make_settings(tmp_path, sandbox="none", trusted_only=True)
    job_id = add_job(settings)
    assert run_job(job_id, settings) == "done"
    assert get_job(settings, job_id).params == 36


# --- the job child's own pieces (no sandbox) ----------------------------------------------


def test_child_error_payload_kinds(tmp_path):
    from inspector.errors import LoadError
    from inspector.job import error_payload

    try:
        try:
            raise MemoryError()
        except MemoryError as inner:
            raise LoadError("building Net() raised MemoryError") from inner
    except LoadError as exc:
        assert error_payload(exc, "load", tmp_path)["kind"] == "out_of_memory"
    user = tmp_path / "upload" / "model.py"
    user.parent.mkdir()
    user.write_text("def f():\n    raise KeyError('k')\n")
    namespace: dict = {}
    exec(compile(user.read_text(), str(user), "exec"), namespace)
    try:
        namespace["f"]()
    except KeyError as exc:
        payload = error_payload(exc, "capture", tmp_path)
    assert payload["kind"] == "user_error" and 'model.py", line 2' in payload["traceback"]
    try:
        {}["ours"]
    except KeyError as exc:
        assert error_payload(exc, "passes", tmp_path)["kind"] == "internal"


def test_child_options_from_job_json():
    from inspector.job import options_from_json

    options = options_from_json({"optimizer": "sgd", "budgets": [10], "unknown": 1, "fake": None})
    assert (options.optimizer, options.budgets_bytes, options.fake) == ("sgd", [10], False)


def test_job_dir_for_a_zip_with_an_input_file(tmp_path):
    import io
    import json
    import zipfile

    from server.jobs import _claim, _prepare_dir, worker_id

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("pkg/model.py", "from pkg.layers import Net\n")
        archive.writestr("pkg/layers.py", "class Net: ...\n")
    settings = make_settings(tmp_path)
    job_id = add_job(
        settings, buffer.getvalue(), filename="m.zip", kind="zip",
        entrypoint="pkg/model.py:Net", input_file=("../x.pt", b"tensor bytes"),
        options={"optimizer": "sgd", "device": "cuda"},
    )  # fmt: skip
    spec = _claim(session_factory_for(str(settings.database_url)), job_id, worker_id())
    job_dir = _prepare_dir(spec, settings)
    assert (job_dir / "upload/pkg/layers.py").read_text() == "class Net: ...\n"
    assert (job_dir / "input/x.pt").read_bytes() == b"tensor bytes"  # no way out of input/
    job = json.loads((job_dir / "job.json").read_text())
    assert job.pop("stage_seconds") == {"import": 0.0}  # no done job yet; the zygote imported
    assert job == {
        "model": "upload/pkg/model.py:Net",
        "input": "input/x.pt",
        "options": {"optimizer": "sgd", "device": "cpu"},  # this worker is cpu-only
    }
    assert get_job(settings, job_id).status == "running"


# --- the zygote (INSPECTOR_JOB_LAUNCH=zygote, the default) ---------------------------------


def _comparable(value):  # noqa: ANN001, ANN202 - any part of a report's JSON
    """A report without what differs between any two runs: when, and how long."""
    if isinstance(value, dict):
        drop = ("timings_s", "created_at", "seconds")
        return {k: _comparable(v) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


@needs_sandbox
def test_a_zygote_child_gives_the_report_a_fresh_child_gives(tmp_path):
    from server.sandbox import pool

    reports, timings = {}, {}
    try:
        for launch in ("fresh", "zygote"):
            settings = make_settings(tmp_path / launch, job_launch=launch)
            job_id = add_job(settings)
            assert run_job(job_id, settings) == "done"
            _assert_tiny_model_done(settings, job_id)
            report = get_job(settings, job_id).report_json
            reports[launch], timings[launch] = _comparable(report), report["meta"]["timings_s"]
    finally:
        pool.close_this_thread()
    assert "zygote_wait" in timings["zygote"] and "zygote_wait" not in timings["fresh"]
    assert timings["zygote"]["import"] < 0.5 * timings["fresh"]["import"]  # imported already
    assert reports["zygote"] == reports["fresh"]


@needs_sandbox
@pytest.mark.slow
def test_the_zygote_is_replaced_after_max_jobs_and_when_it_dies(tmp_path):
    from server.sandbox import pool

    settings = make_settings(tmp_path, zygote_max_jobs=2)
    after, waits = [], []  # this thread's zygote after each job; each job's wait for one
    try:
        for round_ in range(4):
            job_id = add_job(settings)
            assert run_job(job_id, settings) == "done", get_job(settings, job_id).error_message
            waits.append(
                get_job(settings, job_id).report_json["meta"]["timings_s"].get("zygote_wait")
            )
            after.append(pool._slot.zygote)
            if round_ == 2:  # the second zygote dies between jobs
                os.killpg(after[-1].proc.pid, signal.SIGKILL)
    finally:
        pool.close_this_thread()
    first, second, _, third = after
    # Jobs 1-2 ran on the first; the second was started right after job 2 (pre-warmed) and
    # ran job 3; job 4 found it dead and got a third. Every job ran forked from a zygote.
    assert after == [first, second, second, third] and len({id(z) for z in after}) == 3
    assert (first.jobs_run, second.jobs_run, third.jobs_run) == (2, 1, 1)
    assert first.proc.poll() is not None and second.proc.poll() is not None
    assert None not in waits


@needs_sandbox
def test_a_zygote_that_is_not_ready_in_time_leaves_the_job_to_a_fresh_child(tmp_path):
    from server.sandbox import pool

    settings = make_settings(tmp_path, zygote_ready_timeout_s=0.01)
    job_id = add_job(settings)
    try:
        assert run_job(job_id, settings) == "done"
    finally:
        pool.close_this_thread()
    timings = get_job(settings, job_id).report_json["meta"]["timings_s"]
    assert "zygote_wait" not in timings and timings["import"] > 0.2  # a fresh interpreter
