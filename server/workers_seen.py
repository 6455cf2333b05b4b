"""Which model libraries the workers offer: each worker says so in the database (it may run
on another host than the web process), and the upload page reads it back."""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from inspector.schema.libraries import installed_versions
from server.models import WorkerSeen, utcnow

__all__ = ["announce_worker", "libraries_on_offer", "FRESH_S"]

log = logging.getLogger(__name__)
FRESH_S = 300  # a worker not heard of for this long is gone (it announces every <= 30 s)
FORGET_S = 7 * 24 * 3600  # rows of workers gone this long are deleted


def this_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:128]


def announce_worker(session: Session, *, now: dt.datetime | None = None) -> None:
    """Insert or refresh this process's row with the libraries installed here."""
    now = now or utcnow()
    row = session.get(WorkerSeen, this_worker())
    if row is None:
        row = WorkerSeen(id=this_worker(), started_at=now, libraries={})
        session.add(row)
    row.libraries = installed_versions()
    row.seen_at = now
    session.execute(
        delete(WorkerSeen).where(WorkerSeen.seen_at < now - dt.timedelta(seconds=FORGET_S))
    )


def libraries_on_offer(session: Session, *, now: dt.datetime | None = None) -> list[dict]:
    """One entry per distinct set of libraries among the live workers, the most common
    first: `[{"libraries": {"torch": "2.13.0", ...}, "workers": 3}]`; [] when none is live."""
    since = (now or utcnow()) - dt.timedelta(seconds=FRESH_S)
    rows = session.scalars(select(WorkerSeen).where(WorkerSeen.seen_at >= since)).all()
    counts: dict[tuple, int] = {}
    for row in rows:
        key = tuple(sorted(row.libraries.items()))
        counts[key] = counts.get(key, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [{"libraries": dict(key), "workers": n} for key, n in ranked]
