"""What each stage of a job took lately: the medians of recent done reports' `timings_s`,
handed to the job child so its progress bar gives each stage its expected share
(inspector/progress.py). Read as one small JSON path per row, cached per process."""

from __future__ import annotations

import statistics
import threading
import time

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from inspector.progress import DEFAULT_STAGE_SECONDS
from server.db import session_scope
from server.models import Job

__all__ = ["recent_stage_seconds", "stage_seconds", "forget"]

RECENT_JOBS = 20
CACHE_S = 60.0
_cache: dict[str, tuple[float, dict[str, float]]] = {}
_lock = threading.Lock()


def recent_stage_seconds(session: Session, *, limit: int = RECENT_JOBS) -> dict[str, float]:
    """{stage: median seconds} over the last `limit` done reports that timed it."""
    timings = Job.report_json["meta"]["timings_s"]
    done = (Job.status == "done", Job.reused_from.is_(None))  # a reused report never ran
    query = select(timings).where(*done).order_by(Job.finished_at.desc())
    seen: dict[str, list[float]] = {}
    for row in session.scalars(query.limit(limit)):
        for stage, value in (row or {}).items() if isinstance(row, dict) else ():
            if stage in DEFAULT_STAGE_SECONDS and isinstance(value, int | float) and value >= 0:
                seen.setdefault(stage, []).append(float(value))
    return {stage: round(statistics.median(values), 4) for stage, values in seen.items()}


def stage_seconds(factory: sessionmaker[Session], url: str) -> dict[str, float]:
    """`recent_stage_seconds`, recomputed at most once a minute per database."""
    now = time.monotonic()
    with _lock:
        hit = _cache.get(url)
        if hit is not None and now - hit[0] < CACHE_S:
            return dict(hit[1])
    with session_scope(factory) as session:
        value = recent_stage_seconds(session)
    with _lock:
        _cache[url] = (now, value)
    return dict(value)


def forget(url: str) -> None:
    """A job just finished: the next one reads the timings again."""
    with _lock:
        _cache.pop(url, None)
