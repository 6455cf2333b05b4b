"""Retention: `inspector gc --older-than 90d` deletes old reports and the uploads only they used.

Kept whatever their age: reports still queued or running, tagged baselines (a `branch` tag
naming a protected branch, `INSPECTOR_PROTECTED_BRANCHES`, main and master by default, or
`baseline=true`), and any upload another kept report still references. Staging files left
by an interrupted upload (`<data_dir>/tmp`, over a day old) are removed too.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from dataclasses import dataclass, field

from sqlalchemy import delete, or_, select, union
from sqlalchemy.orm import Session

from inspector.schema.statuses import FINAL_STATUSES
from server.db import make_engine, make_session_factory, session_scope
from server.models import Job, Tag, Upload, utcnow
from server.settings import Settings
from server.storage import UploadStore

__all__ = ["GcError", "GcResult", "parse_age", "run_gc"]

_AGE = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
STAGING_MAX_AGE_S = 86400


class GcError(ValueError):
    pass


@dataclass
class GcResult:
    jobs: list[int] = field(default_factory=list)
    uploads: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    staging_files: int = 0

    def summary(self, *, dry_run: bool) -> str:
        verb = "would delete" if dry_run else "deleted"
        return (
            f"{verb} {len(self.jobs)} report(s), {len(self.uploads)} upload(s) "
            f"({self.bytes_freed} bytes), {self.staging_files} stale staging file(s)"
        )


def parse_age(text: str) -> dt.timedelta:
    """'90d', '12h', '2w', '30m', '45s' -> a timedelta."""
    match = _AGE.match(text or "")
    if match is None:
        raise GcError(f"--older-than {text!r}: give a number and a unit, e.g. 90d, 12h, 2w")
    return dt.timedelta(seconds=int(match.group(1)) * _UNIT_S[match.group(2)])


def _protected_ids(settings: Settings):  # noqa: ANN202 - a SQL subquery
    branch = (Tag.key == "branch") & Tag.value.in_(settings.protected_branch_list)
    baseline = (Tag.key == "baseline") & (Tag.value.in_(["true", "True", "1", "yes"]))
    return select(Tag.job_id).where(or_(branch, baseline))


def _old_jobs(session: Session, settings: Settings, cutoff: dt.datetime) -> list[int]:
    query = select(Job.id).where(
        Job.created_at < cutoff,
        Job.status.in_(FINAL_STATUSES),
        Job.id.not_in(_protected_ids(settings)),
    )
    return list(session.scalars(query.order_by(Job.id)))


def _orphan_uploads(session: Session, gone: list[int]) -> list[Upload]:
    """Uploads used by the `gone` jobs and by no other job."""
    if not gone:
        return []
    used_by_gone = union(
        select(Job.upload_sha256).where(Job.id.in_(gone)),
        select(Job.input_sha256).where(Job.id.in_(gone), Job.input_sha256.is_not(None)),
    ).subquery()
    kept = Job.id.not_in(gone)
    used_by_kept = union(
        select(Job.upload_sha256).where(kept),
        select(Job.input_sha256).where(kept, Job.input_sha256.is_not(None)),
    ).subquery()
    query = select(Upload).where(
        Upload.sha256.in_(select(used_by_gone.c[0])),
        Upload.sha256.not_in(select(used_by_kept.c[0])),
    )
    return list(session.scalars(query.order_by(Upload.sha256)))


def _stale_staging(store: UploadStore, dry_run: bool) -> int:
    if not store.tmp.is_dir():
        return 0
    count = 0
    for path in store.tmp.glob("up-*"):
        try:
            if time.time() - path.stat().st_mtime > STAGING_MAX_AGE_S:
                count += 1
                if not dry_run:
                    path.unlink()
        except FileNotFoundError:  # an upload finished meanwhile
            continue
    return count


def run_gc(settings: Settings, *, older_than: dt.timedelta, dry_run: bool = False) -> GcResult:
    """Delete (or with `dry_run` only list) reports older than `older_than`, then the files."""
    factory = make_session_factory(make_engine(str(settings.database_url)))
    store = UploadStore(settings.data_dir)
    result = GcResult()
    with session_scope(factory) as session:
        result.jobs = _old_jobs(session, settings, utcnow() - older_than)
        uploads = _orphan_uploads(session, result.jobs)
        result.uploads = [u.sha256 for u in uploads]
        result.bytes_freed = sum(int(u.size_bytes) for u in uploads)
        if not dry_run and result.jobs:
            session.execute(delete(Tag).where(Tag.job_id.in_(result.jobs)))
            session.execute(delete(Job).where(Job.id.in_(result.jobs)))
            session.execute(delete(Upload).where(Upload.sha256.in_(result.uploads)))
    if not dry_run:  # rows first, then files: a row never points at a missing file
        for sha in result.uploads:
            store.path(sha).unlink(missing_ok=True)
    result.staging_files = _stale_staging(store, dry_run)
    return result
