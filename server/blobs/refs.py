"""Which stored uploads nothing references any more: what deleting a report and `inspector
gc` may delete. Rows go first, blobs after: a row never points at a missing blob, and a
blob left by a crash in between is an orphan that `inspector gc` finds later.

An upload of the same file may race with the deletion. A database blob is locked before
the last check, so that upload's job is seen and the blob kept. A file cannot be locked:
the check runs just before the unlink, which leaves a window of a few milliseconds in which
that upload (file stored, job not yet committed) can lose its file; its job then fails at
`prepare` saying the file is missing, and the user uploads again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

from sqlalchemy import Connection, delete, or_, select
from sqlalchemy.orm import Session

from server.models import Job, Upload
from server.storage import UploadStore

__all__ = ["unused_uploads", "referenced", "forget_uploads", "still_used", "delete_blobs"]

_BATCH = 500


def _batches(names: Iterable[str]) -> Iterable[list[str]]:
    names = sorted(set(filter(None, names)))
    for i in range(0, len(names), _BATCH):
        yield names[i : i + _BATCH]


def _used_by_jobs(session: Session, names: list[str], ignoring: Sequence[int]) -> set[str]:
    uses = or_(Job.upload_sha256.in_(names), Job.input_sha256.in_(names))
    query = select(Job.upload_sha256, Job.input_sha256).where(uses)
    if ignoring:
        query = query.where(Job.id.not_in(list(ignoring)))
    return {sha for row in session.execute(query) for sha in row if sha in names}


def unused_uploads(
    session: Session, *, sha256s: Iterable[str], ignoring_jobs: Sequence[int] = ()
) -> list[Upload]:
    """The `uploads` rows among `sha256s` that no job (but `ignoring_jobs`) uses."""
    found: list[Upload] = []
    for names in _batches(sha256s):
        used = _used_by_jobs(session, names, ignoring_jobs)
        rows = session.scalars(select(Upload).where(Upload.sha256.in_(names)))
        found += [row for row in rows if row.sha256 not in used]
    return sorted(found, key=lambda u: u.sha256)


def referenced(session: Session, *, sha256s: Iterable[str]) -> set[str]:
    """The ones among `sha256s` that an `uploads` row or a job names."""
    found: set[str] = set()
    for names in _batches(sha256s):
        found |= _used_by_jobs(session, names, ())
        found.update(session.scalars(select(Upload.sha256).where(Upload.sha256.in_(names))))
    return found


def forget_uploads(session: Session, *, sha256s: Sequence[str]) -> None:
    """Delete these `uploads` rows (in the session's transaction; the caller commits)."""
    for names in _batches(sha256s):
        session.execute(delete(Upload).where(Upload.sha256.in_(names)))


def still_used(conn: Connection, sha256: str) -> bool:
    """Whether an `uploads` row or a job names `sha256` now (asked with the blob locked)."""
    if conn.scalar(select(Upload.sha256).where(Upload.sha256 == sha256)) is not None:
        return True
    uses = or_(Job.upload_sha256 == sha256, Job.input_sha256 == sha256)
    return conn.scalar(select(Job.id).where(uses).limit(1)) is not None


def delete_blobs(store: UploadStore, *, sha256s: Iterable[str], since: dt.datetime) -> int:
    """Delete these blobs from every backend, sparing any put again at or after `since`
    and, in the database, any that a job committed meanwhile uses (an upload of the same
    file racing with the delete); how many went."""
    deleted = (store.delete(sha, unless_put_since=since, still_used=still_used) for sha in sha256s)
    return sum(deleted)
