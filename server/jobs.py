"""Run one job: claim its row, prepare its folder, run the sandboxed child, store how it ended.

The job folder `<data_dir>/jobs/<id>-<random>/` holds `upload/` (the model: a .py or .pt2
copied, a .zip safely extracted), `input/` (an optional tensor file) and `job.json`, all
read-only inside the sandbox; the child writes `progress.jsonl` and `report.json` or
`error.json` next to them. The folder is removed afterwards; the upload stays in the store.
Uploads come from this host's upload directory or, through a verified local cache, from
the database's blob store (server.blobs.fetch): a worker on another host needs no shared disk.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from server.blobs.fetch import stored_file
from server.db import make_engine, make_session_factory, session_scope
from server.logs import job_context
from server.models import Job, utcnow
from server.sandbox import Limits, job_python_command, pool, run_child, sandbox_available
from server.sandbox.childfiles import ProgressReader
from server.sandbox.ending import Ending, ending_from_outcome, failure
from server.sandbox.forked import run_forked
from server.sandbox.runner import Outcome
from server.sandbox.zygote import ZygoteError
from server.settings import Settings
from server.stagetimes import forget, stage_seconds
from server.summary import summary_columns

__all__ = ["run_job", "session_factory_for", "worker_id", "JobSpec", "prewarm"]

log = logging.getLogger(__name__)
READONLY = ("upload", "input", "job.json")


@lru_cache(maxsize=8)
def session_factory_for(url: str) -> sessionmaker[Session]:
    """One engine per database URL for the worker's whole life."""
    return make_session_factory(make_engine(url))


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.current_thread().name}"[:128]


@dataclass
class JobSpec:
    """What the worker needs of a job row, read once after claiming it."""

    id: int
    upload_sha256: str
    upload_filename: str
    upload_kind: str
    entrypoint: str
    input_spec: str | None
    input_sha256: str | None
    input_filename: str | None
    options: dict[str, Any]
    created_at: dt.datetime
    started_at: dt.datetime
    worker: str = ""
    timings: dict[str, float] = field(default_factory=dict)


def _claim(factory: sessionmaker[Session], job_id: int, me: str) -> JobSpec | None:
    """Mark a queued job running, atomically: a second worker (or a duplicate message)
    finds it no longer queued and leaves it."""
    now = utcnow()
    with session_scope(factory) as session:
        claimed = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "queued")
            .values(status="running", attempts=Job.attempts + 1, worker_id=me, started_at=now)
            .values(heartbeat_at=now, stage="starting", progress=0, finished_at=None)
            .values(error_kind=None, error_message=None, error_json=None, report_json=None)
        ).rowcount
        if claimed != 1:
            return None
        job = session.get(Job, job_id)
        cols = ("upload_sha256", "upload_filename", "upload_kind", "entrypoint", "input_spec")
        cols += ("input_sha256", "input_filename", "created_at")
        values = {c: getattr(job, c) for c in cols}
        return JobSpec(job_id, options=dict(job.options or {}), started_at=now, worker=me, **values)


def _prepare_dir(spec: JobSpec, settings: Settings) -> Path:
    from server.ziputil import safe_extract

    engine = session_factory_for(str(settings.database_url)).kw["bind"]
    root = settings.data_dir / "jobs"
    root.mkdir(parents=True, exist_ok=True)
    job_dir = root / f"{spec.id}-{secrets.token_hex(6)}"
    job_dir.mkdir(mode=0o700)
    (job_dir / "upload").mkdir()
    (job_dir / "input").mkdir()
    source = stored_file(settings.data_dir, engine, sha256=spec.upload_sha256, what="model")
    if spec.upload_kind == "zip":
        safe_extract(
            source,
            job_dir / "upload",
            max_files=settings.max_zip_files,
            max_bytes=settings.max_zip_uncompressed_bytes,
        )
    else:
        shutil.copyfile(source, job_dir / "upload" / _plain_name(spec.upload_filename))
    if spec.input_sha256:
        target = job_dir / "input" / _plain_name(spec.input_filename or "input.pt")
        stored = stored_file(settings.data_dir, engine, sha256=spec.input_sha256, what="input")
        shutil.copyfile(stored, target)
    (job_dir / "job.json").write_text(_job_json(spec, settings), encoding="utf-8")
    return job_dir


def _plain_name(name: str) -> str:
    base = os.path.basename(name.replace("\\", "/"))
    return base if base not in ("", ".", "..") else "file"


def _job_json(spec: JobSpec, settings: Settings) -> str:
    import json

    if spec.upload_kind == "preset":
        model = spec.entrypoint  # preset:NAME, built by the child; the upload only names it
    elif spec.upload_kind in ("pt2", "config"):
        model = f"upload/{_plain_name(spec.upload_filename)}"
    else:
        model = f"upload/{spec.entrypoint.lstrip('/')}"
    data: str | None = spec.input_spec
    if spec.input_sha256:
        data = f"input/{_plain_name(spec.input_filename or 'input.pt')}"
    options = dict(spec.options)
    options["device"] = _device(spec, settings)
    seconds = _expected_seconds(settings)
    return json.dumps({"model": model, "input": data, "options": options, "stage_seconds": seconds})


def _expected_seconds(settings: Settings) -> dict[str, float]:
    """Seconds each stage took lately (the child's progress shares); {} when unknown."""
    url = str(settings.database_url)
    try:
        seconds = stage_seconds(session_factory_for(url), url)
    except Exception:  # progress is no reason to fail a job
        log.warning("no recent stage timings for the progress bar", exc_info=True)
        seconds = {}
    seconds.pop("import", None)  # recent jobs may have been forked or fresh: not theirs
    if settings.job_launch == "zygote" and settings.sandbox != "none":
        seconds["import"] = 0.0  # the zygote imported torch and the pipeline already
    return seconds


def _device(spec: JobSpec, settings: Settings) -> str:
    device = str(spec.options.get("device") or settings.device)
    if settings.device == "cpu":  # an operator's cpu-only worker wins over the request
        return "cpu"
    return device if device in ("auto", "cpu", "cuda") else "auto"


class _Heartbeat:
    """on_tick: follow progress and touch the row when it changes, or every heartbeat_s."""

    def __init__(self, factory: sessionmaker, spec: JobSpec, job_dir: Path, every_s: float) -> None:
        self.factory, self.spec, self.every_s = factory, spec, every_s
        self.progress = ProgressReader(job_dir / "progress.jsonl")
        self.last = time.monotonic()

    def __call__(self) -> None:
        changed = self.progress.poll()
        if not changed and time.monotonic() - self.last < self.every_s:
            return
        self.last = time.monotonic()
        values: dict[str, Any] = {"heartbeat_at": utcnow()}
        if self.progress.stage is not None:
            values.update(stage=self.progress.stage, progress=self.progress.percent)
        with session_scope(self.factory) as session:
            session.execute(
                update(Job).where(Job.id == self.spec.id, Job.worker_id == self.spec.worker)
                .values(**values)
            )  # fmt: skip


def _wants_gpu(device: str) -> bool:
    return device in ("auto", "cuda") and any(Path("/dev").glob("nvidia[0-9]*"))


def _zygote_key(settings: Settings, gpu: bool) -> pool.ZygoteKey | None:
    """The zygote for jobs under these settings, or None: fresh children only."""
    if settings.job_launch != "zygote" or settings.sandbox == "none":
        return None
    limits = Limits.from_settings(settings, cuda=gpu)
    return pool.ZygoteKey(settings.data_dir / "jobs", limits, gpu)


def prewarm(settings: Settings) -> None:
    """Start this thread's zygote ahead of its first job (a consumer thread's start)."""
    key = _zygote_key(settings, _wants_gpu(str(settings.device)))
    if key is not None and sandbox_available()[0]:
        pool.prewarm(key)


def _execute(
    spec: JobSpec,
    job_dir: Path,
    settings: Settings,
    factory: sessionmaker[Session],
    should_stop: Callable[[], bool] | None,
) -> Ending:
    confined = settings.sandbox != "none"
    gpu = _wants_gpu(_device(spec, settings))
    limits = Limits.from_settings(settings, cuda=gpu)
    beat = _Heartbeat(factory, spec, job_dir, settings.job_heartbeat_s)
    # One line per sandboxed child started: the load bench counts them (each job runs once).
    log.info("sandbox start", extra={"event": "sandbox_start", "worker": spec.worker})
    outcome = _in_zygote(spec, job_dir, settings, limits, gpu, beat, should_stop)
    if outcome is None:
        outcome = run_child(
            job_python_command(), job_dir, limits, confined=confined, readonly=READONLY,
            gpu=gpu, on_tick=beat, should_stop=should_stop,
        )  # fmt: skip
    beat.progress.poll()
    start_t = beat.progress.times.get("start")
    if start_t is not None:
        spec.timings["sandbox_start"] = round(start_t - outcome.started_at, 4)
    spec.timings["child"] = round(outcome.duration_s, 4)
    return ending_from_outcome(outcome, job_dir, beat.progress.stage or "start")


def _in_zygote(spec, job_dir, settings, limits, gpu, beat, should_stop) -> Outcome | None:  # noqa: ANN001
    """The job run by this thread's zygote; None when no zygote can take it (run it fresh)."""
    key = _zygote_key(settings, gpu)
    if key is None:
        return None
    zygote, waited = pool.take(key, settings.zygote_ready_timeout_s, should_stop, beat)
    if zygote is None:
        return None
    spec.timings["zygote_wait"] = round(waited, 4)
    try:
        return run_forked(
            zygote, job_dir, limits, readonly=READONLY, on_tick=beat, should_stop=should_stop
        )
    except ZygoteError as exc:  # before the job started: it runs fresh instead
        log.warning("job %s: %s; running it as a fresh child", spec.id, exc)
        return None
    finally:
        pool.give_back(zygote, settings.zygote_max_jobs)


def _refusal(settings: Settings) -> str | None:
    """Why this worker must not run uploads at all, or None."""
    if settings.sandbox == "none":
        if settings.trusted_only:
            return None
        return "the worker has no sandbox (INSPECTOR_SANDBOX=none) and is not in trusted-only mode"
    ok, why = sandbox_available()
    return None if ok else f"no working sandbox on the worker: {why}"


def _final_values(spec: JobSpec, ending: Ending) -> dict[str, Any]:
    now = utcnow()
    if ending.status == "interrupted":  # our shutdown, not the job's fault: run it again
        return {
            "status": "queued", "stage": "requeued", "worker_id": None, "heartbeat_at": None,
            "started_at": None, "attempts": Job.attempts - 1,
        }  # fmt: skip
    values: dict[str, Any] = {"status": ending.status, "finished_at": now, "heartbeat_at": now}
    values["stage"] = ending.stage
    if ending.report is not None:
        timings = ending.report.setdefault("meta", {}).setdefault("timings_s", {})
        timings["queue_wait"] = round((spec.started_at - spec.created_at).total_seconds(), 4)
        timings.update(spec.timings)
        values["report_json"] = ending.report
    if ending.status == "done":
        values.update(summary_columns(ending.report or {}), progress=100)
    if ending.error is not None:
        values.update(error_kind=ending.error["kind"], error_message=ending.error["message"])
        values["error_json"] = ending.error
    return values


def _finish(factory: sessionmaker[Session], spec: JobSpec, ending: Ending) -> None:
    with session_scope(factory) as session:
        done = session.execute(
            update(Job).where(Job.id == spec.id, Job.worker_id == spec.worker)
            .where(Job.status == "running").values(**_final_values(spec, ending))
        ).rowcount  # fmt: skip
    if done != 1:
        log.warning("job %s was taken from this worker (stale heartbeat?); result dropped", spec.id)


def run_job(
    job_id: int, settings: Settings, *, should_stop: Callable[[], bool] | None = None
) -> str | None:
    """Run job `job_id` if it is still queued; returns its final status (None: not ours)."""
    with job_context(job_id):
        status = _run_job(job_id, settings, should_stop)
    return status


def _run_job(job_id: int, settings: Settings, should_stop: Callable[[], bool] | None) -> str | None:
    factory = session_factory_for(str(settings.database_url))
    spec = _claim(factory, job_id, worker_id())
    if spec is None:
        log.info("job %s is not queued any more; skipped", job_id)
        return None
    job_dir: Path | None = None
    try:
        refusal = _refusal(settings)
        if refusal is not None:
            ending = failure("internal", f"{refusal}. The upload is kept: re-run it later.")
        else:
            job_dir = _prepare_dir(spec, settings)
            ending = _execute(spec, job_dir, settings, factory, should_stop)
    except Exception as exc:  # our bug or a broken store: the job still gets an ending
        log.exception("job %s failed in the worker", job_id)
        ending = failure("internal", f"the worker could not run this job: {exc}", stage="prepare")
    finally:
        if job_dir is not None:
            shutil.rmtree(job_dir, ignore_errors=True)
    _finish(factory, spec, ending)
    if ending.status == "done":
        forget(str(settings.database_url))  # its timings size the next job's progress
    log.info("job ended: %s", ending.status, extra={"event": "job_end", "status": ending.status})
    if ending.status == "interrupted":
        from server.queue import enqueue_job

        enqueue_job(job_id, settings)
    return "queued" if ending.status == "interrupted" else ending.status
