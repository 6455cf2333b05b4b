"""The job queue: huey on Redis when `redis_url` is set, else a SQLite file in the data dir.

A message carries only a job id; everything else is in the database. The web process
enqueues; workers dequeue (server.worker) and run `server.jobs.run_job` themselves.
"""

from __future__ import annotations

import threading
from typing import Any

from huey import Huey, RedisHuey, SqliteHuey

__all__ = ["get_huey", "enqueue_job", "queue_key", "job_id_of"]

_lock = threading.Lock()
_instances: dict[tuple[str, str], tuple[Huey, Any]] = {}


def queue_key(settings: Any) -> tuple[str, str]:
    """(backend location, queue name): what makes two settings share a queue."""
    where = settings.redis_url or str(settings.data_dir / "queue.db")
    return where, settings.queue_name


def _make(settings: Any) -> Huey:
    if settings.redis_url:
        return RedisHuey(settings.queue_name, url=settings.redis_url, results=False)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    path = settings.data_dir / "queue.db"
    return SqliteHuey(settings.queue_name, filename=str(path), results=False)


def run_job_task(job_id: int) -> None:
    """What a stock huey consumer would run; `inspector worker` dequeues and runs jobs itself."""
    from server.jobs import run_job
    from server.settings import get_settings

    run_job(job_id, get_settings())


def _entry(settings: Any) -> tuple[Huey, Any]:
    key = queue_key(settings)
    with _lock:
        if key not in _instances:
            huey = _make(settings)
            _instances[key] = (huey, huey.task(name="run_job")(run_job_task))
        return _instances[key]


def get_huey(settings: Any) -> Huey:
    """The (cached) huey instance for these settings."""
    return _entry(settings)[0]


def enqueue_job(job_id: int, settings: Any) -> None:
    """Queue job `job_id` (its row must already be committed as `queued`)."""
    _entry(settings)[1](int(job_id))


def job_id_of(task: Any) -> int | None:
    """The job id a dequeued task carries, or None for anything else."""
    args = getattr(task, "args", None) or ()
    return int(args[0]) if len(args) == 1 and isinstance(args[0], int) else None
