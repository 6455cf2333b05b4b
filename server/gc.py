"""Retention: `inspector gc --older-than 90d` deletes old reports and the uploads only they used.

Kept whatever their age: reports still queued or running, tagged baselines (a `branch` tag
naming a protected branch, `INSPECTOR_PROTECTED_BRANCHES`, main and master by default, or
`baseline=true`), and any upload another kept report still references. Uploads go from
both blob backends (the upload directory and the database). Also removed: orphan blobs
(named by no row, over a day old), staging files left by an interrupted upload
(`<data_dir>/tmp`, over a day old) and, on this host, worker copies of deleted blobs.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from dataclasses import dataclass, field

from sqlalchemy import Engine, delete, or_, select
from sqlalchemy.orm import Session, sessionmaker

from inspector.schema.statuses import FINAL_STATUSES
from server.blobs.fetch import prune_cache
from server.blobs.refs import delete_blobs, forget_uploads, referenced, unused_uploads
from server.db import make_engine, make_session_factory, session_scope
from server.models import Blob, Job, Tag, Upload, utcnow
from server.settings import Settings
from server.storage import UploadStore, open_store

__all__ = ["GcError", "GcResult", "parse_age", "run_gc"]

_AGE = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
STAGING_MAX_AGE_S = 86400
ORPHAN_MIN_AGE_S = 86400  # a blob stored this recently may still be getting its rows


class GcError(ValueError):
    pass


@dataclass
class GcResult:
    jobs: list[int] = field(default_factory=list)
    uploads: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    staging_files: int = 0
    orphan_blobs: list[str] = field(default_factory=list)
    cache_files: int = 0  # this host's worker copies removed

    def summary(self, *, dry_run: bool) -> str:
        verb = "would delete" if dry_run else "deleted"
        return (
            f"{verb} {len(self.jobs)} report(s), {len(self.uploads)} upload(s) "
            f"({self.bytes_freed} bytes), {len(self.orphan_blobs)} orphan blob(s), "
            f"{self.staging_files} stale staging file(s), {self.cache_files} cached copies"
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


def _files_of(session: Session, jobs: list[int]) -> set[str]:
    rows = session.execute(select(Job.upload_sha256, Job.input_sha256).where(Job.id.in_(jobs)))
    return {sha for row in rows for sha in row if sha}


def _orphan_blobs(session: Session, store: UploadStore, cutoff: dt.datetime) -> list[str]:
    """Blobs, in either backend, that nothing names and nobody stored since `cutoff`: left
    by a crash between storing a blob and its rows, or between deleting them."""
    found = {sha for sha, _size, put in store.local.listing() if put < cutoff}
    if store.database is not None:
        query = select(Blob.sha256).where(Blob.touched_at < cutoff)
        found.update(session.scalars(query.where(Blob.sha256.not_in(select(Upload.sha256)))))
    return sorted(found - referenced(session, sha256s=found))


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
    """Delete (or with `dry_run` only list) reports older than `older_than`, then the files
    only they used, orphan blobs, stale staging files and this host's unused blob copies."""
    engine = make_engine(str(settings.database_url))
    try:
        return _run_gc(settings, engine, older_than, dry_run)
    finally:
        engine.dispose()


def _run_gc(
    settings: Settings, engine: Engine, older_than: dt.timedelta, dry_run: bool
) -> GcResult:
    store = open_store(settings, engine)
    started = utcnow()
    result = GcResult()
    _old_reports(result, make_session_factory(engine), settings, started - older_than, dry_run)
    if not dry_run:  # rows first, then blobs: a row never points at a missing blob
        delete_blobs(store, sha256s=result.uploads, since=started)
    orphan_cutoff = started - dt.timedelta(seconds=ORPHAN_MIN_AGE_S)
    with session_scope(make_session_factory(engine)) as session:
        result.orphan_blobs = _orphan_blobs(session, store, orphan_cutoff)
    if not dry_run:
        delete_blobs(store, sha256s=result.orphan_blobs, since=orphan_cutoff)
        result.cache_files = len(_prune_cache(settings, engine))
    result.staging_files = _stale_staging(store, dry_run)
    return result


def _old_reports(
    result: GcResult, factory: sessionmaker, settings: Settings, cutoff: dt.datetime, dry_run: bool
) -> None:
    """Old reports and the uploads only they used, into `result`; their rows deleted."""
    with session_scope(factory) as session:
        result.jobs = _old_jobs(session, settings, cutoff)
        files = _files_of(session, result.jobs) if result.jobs else set()
        uploads = unused_uploads(session, sha256s=files, ignoring_jobs=result.jobs)
        result.uploads = [u.sha256 for u in uploads]
        result.bytes_freed = sum(int(u.size_bytes) for u in uploads)
        if not dry_run and result.jobs:
            session.execute(delete(Tag).where(Tag.job_id.in_(result.jobs)))
            session.execute(delete(Job).where(Job.id.in_(result.jobs)))
            forget_uploads(session, sha256s=result.uploads)


def _prune_cache(settings: Settings, engine: Engine) -> list[str]:
    """This host's worker copies of blobs gone from the database (or past the cache size)."""
    max_bytes = settings.blob_cache_bytes
    return prune_cache(settings.data_dir, engine, max_bytes=max_bytes).removed
