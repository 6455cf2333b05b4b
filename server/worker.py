"""The worker: consumer threads that take job ids off the queue and run them, plus a sweep.

Threads are enough: the work happens in one sandboxed child process per job, which a
thread only watches. `inspector worker` runs `run_worker(settings)`; `inspector serve`
runs `start_embedded_worker(settings)` beside the web server and `.stop()`s it.

The sweep keeps the queue honest: a job `running` with a stale heartbeat (its worker
died) is queued again once, then failed with a clear reason; a job left `queued` while
the queue is empty (its message was lost) is queued again.
"""

from __future__ import annotations

import datetime as dt
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

from sqlalchemy import select, update

from server.blobs.fetch import prune_cache
from server.db import session_scope
from server.jobs import prewarm, run_job, session_factory_for
from server.logs import configure_logging
from server.models import Job, utcnow
from server.queue import enqueue_job, get_huey, job_id_of
from server.sandbox import pool, sandbox_available
from server.settings import Settings
from server.workers_seen import announce_worker

__all__ = [
    "run_worker", "start_embedded_worker", "start_sweeper", "WorkerHandle", "sweep", "MAX_ATTEMPTS",
]  # fmt: skip

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 2  # a job whose worker died is retried once
CACHE_PRUNE_EVERY_S = 600  # the blob cache is pruned at start and then this often
POLL_S = 0.1  # SQLite queue polling (Redis blocks on its list instead)


def _consume(settings: Settings, stop: threading.Event) -> None:
    huey = get_huey(settings)
    try:
        prewarm(settings)  # this thread's zygote imports torch while the queue is empty
    except Exception:  # no zygote: the jobs run as fresh children
        log.exception("starting the zygote failed")
    try:
        _consume_loop(settings, stop, huey)
    finally:
        pool.close_this_thread()


def _consume_loop(settings: Settings, stop: threading.Event, huey) -> None:  # noqa: ANN001
    while not stop.is_set():
        try:
            task = huey.dequeue()
        except Exception:  # queue backend down: wait, then try again
            log.exception("cannot read the job queue")
            stop.wait(2.0)
            continue
        if task is None:
            stop.wait(POLL_S)
            continue
        job_id = job_id_of(task)
        if job_id is None:
            log.warning("ignoring a queue message that is not a job: %r", task)
            continue
        try:
            run_job(job_id, settings, should_stop=stop.is_set)
        except Exception:
            log.exception("job %s: the worker failed to record its ending", job_id)


def _stale_message(attempts: int) -> str:
    return (
        f"the worker running this job stopped responding ({attempts} attempts); "
        "it may have been restarted or lost its machine. The upload is kept: re-run it."
    )


def sweep(settings: Settings) -> dict[str, list[int]]:
    """One pass: requeue or fail jobs of dead workers, requeue lost queued jobs."""
    factory = session_factory_for(str(settings.database_url))
    now = utcnow()
    stale_before = now - dt.timedelta(seconds=settings.job_stale_after_s)
    result: dict[str, list[int]] = {"requeued": [], "failed": [], "lost": []}
    with session_scope(factory) as session:
        stale = session.scalars(
            select(Job).where(Job.status == "running", Job.heartbeat_at < stale_before)
        ).all()
        for job in stale:
            outcome = _settle_stale(session, job, now)
            if outcome is not None:  # None: another sweep (worker or server) got there first
                result[outcome].append(job.id)
        result["lost"] = _lost_jobs(session, settings, now)
    for job_id in result["requeued"] + result["lost"]:
        try:
            enqueue_job(job_id, settings)
        except Exception:  # queue down: the row stays queued; a later sweep finds it lost
            log.warning("sweep: could not queue job %s again (queue down?)", job_id)
    if any(result.values()):
        log.warning("sweep: %s", result)
    return result


def _settle_stale(session, job: Job, now: dt.datetime) -> str | None:  # noqa: ANN001
    """Queue a dead worker's job again (first loss) or fail it (`worker_lost`)."""
    guard = (Job.id == job.id, Job.status == "running", Job.heartbeat_at == job.heartbeat_at)
    if job.attempts < MAX_ATTEMPTS:
        values = {"status": "queued", "stage": "requeued", "worker_id": None}
        outcome = "requeued"
    else:
        message = _stale_message(job.attempts)
        error = {"kind": "worker_lost", "message": message, "stage": job.stage}
        values = {"status": "failed", "finished_at": now, "error_kind": "worker_lost"}
        values.update(error_message=message, error_json=error)
        outcome = "failed"
    rows = session.execute(update(Job).where(*guard).values(**values)).rowcount
    return outcome if rows == 1 else None


def _lost_jobs(session, settings: Settings, now: dt.datetime) -> list[int]:  # noqa: ANN001
    try:
        if get_huey(settings).pending_count() > 0:
            return []  # they may still be in the queue, behind others
    except Exception:  # queue down: keep the stale-job changes, look for lost ones next time
        log.warning("sweep: the queue does not answer; lost jobs are looked for next time")
        return []
    old = now - dt.timedelta(seconds=settings.job_lost_after_s)
    query = select(Job.id).where(Job.status == "queued", Job.created_at < old)
    return list(session.scalars(query.order_by(Job.id).limit(100)))


def _sweeper(settings: Settings, stop: threading.Event, announce: bool = False) -> None:
    every = max(1.0, min(settings.job_stale_after_s / 2, 30.0))
    next_prune = 0.0  # monotonic time is never below 0: the first round prunes
    while not stop.is_set():
        if announce:
            _announce(settings)
        try:
            sweep(settings)
        except Exception:
            log.exception("sweep failed")
        if time.monotonic() >= next_prune:
            next_prune = time.monotonic() + CACHE_PRUNE_EVERY_S
            prune_blob_cache(settings)
        stop.wait(every)


def _announce(settings: Settings) -> None:
    """Tell the upload page which libraries this worker's jobs can import."""
    try:
        with session_scope(session_factory_for(str(settings.database_url))) as session:
            announce_worker(session)
    except Exception:  # the database is down: the next round tries again
        log.exception("announcing the worker failed")


def prune_blob_cache(settings: Settings) -> None:
    """Drop this host's copies of blobs deleted from the database (a deleted report, `inspector
    gc` on another host), then the least recently used past INSPECTOR_BLOB_CACHE_BYTES."""
    engine = session_factory_for(str(settings.database_url)).kw["bind"]
    try:
        pruned = prune_cache(settings.data_dir, engine, max_bytes=settings.blob_cache_bytes)
    except Exception:  # the database is down: the next round tries again
        log.exception("pruning the blob cache failed")
        return
    if pruned.removed or pruned.partials:
        log.info("blob cache: removed %d copies (%d bytes), %d dead downloads",
                 len(pruned.removed), pruned.bytes_freed, pruned.partials)  # fmt: skip


@dataclass
class WorkerHandle:
    """Running consumer threads; `stop()` ends them (a running child is killed and its
    job queued again)."""

    settings: Settings
    stop_event: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    refusal: str | None = None  # why no job runs on this worker, if so
    consumers: bool = True  # False: the sweep alone (a server beside separate workers)

    def start(self) -> WorkerHandle:
        count = self._count() if self.consumers else 0
        common = (self.settings, self.stop_event)
        targets = [(_consume, f"inspector-worker-{i + 1}", common) for i in range(count)]
        # The sweeper of a worker that runs jobs also says which libraries it has.
        targets.append((_sweeper, "inspector-sweeper", (*common, count > 0)))
        for target, name, args in targets:
            thread = threading.Thread(target=target, args=args, name=name, daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def _count(self) -> int:
        return max(1, int(self.settings.worker_concurrency))

    def stop(self, timeout: float = 30.0) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout)

    @property
    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)


def check_sandbox(settings: Settings) -> str | None:
    """None when this worker may run uploads; else why not (said loudly, never bypassed)."""
    if settings.sandbox == "none":
        if settings.trusted_only:
            log.warning("TRUSTED-ONLY MODE: uploads run WITHOUT a sandbox (operator's choice)")
            return None
        return "INSPECTOR_SANDBOX=none without INSPECTOR_TRUSTED_ONLY=true: refusing to run uploads"
    ok, why = sandbox_available()
    return None if ok else f"no working sandbox, refusing to run uploads: {why}"


def start_embedded_worker(settings: Settings) -> WorkerHandle:
    """Consumer threads inside `inspector serve`; without a sandbox, none are started."""
    handle = WorkerHandle(settings)
    handle.refusal = check_sandbox(settings)
    if handle.refusal is not None:
        log.error("embedded worker not started: %s", handle.refusal)
        return handle
    log.info("embedded worker: %d thread(s)", handle._count())
    return handle.start()


def start_sweeper(settings: Settings) -> WorkerHandle:
    """The periodic sweep alone: `serve` runs it when the workers are separate processes, so
    no job stays `running` forever even while every worker is down."""
    log.info("no embedded worker (INSPECTOR_EMBEDDED_WORKER=false): sweep only")
    return WorkerHandle(settings, consumers=False).start()


def run_worker(settings: Settings) -> int:
    """`inspector worker`: run until SIGINT/SIGTERM; 2 when no sandbox works here."""
    configure_logging(settings.log_format)
    refusal = check_sandbox(settings)
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    handle = WorkerHandle(settings).start()
    stop = handle.stop_event
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    log.info("worker started: %d thread(s), queue %s", handle._count(), settings.queue_name)
    while not stop.wait(1.0):
        pass
    log.info("worker stopping")
    handle.stop()
    return 0
