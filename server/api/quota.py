"""The upload store's quota: past `INSPECTOR_MAX_DATA_BYTES` (or a full disk or database)
uploads get 507.

Counts every stored upload, in either blob backend (each has its `uploads` row, committed
with its blob). Checked before a staged file is committed, so a refused upload leaves
nothing behind and everything already stored stays (nothing is evicted to make room:
`inspector gc` does that).
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from server.api.errors import ApiError
from server.models import Upload
from server.settings import Settings
from server.storage import Staged, UploadStore

__all__ = ["check_quota", "commit_upload", "is_disk_full", "disk_full_error"]

ADVICE = "An operator can free space with `inspector gc --older-than 90d` or raise the limit."


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_error() -> ApiError:
    return ApiError(507, "insufficient_storage", f"the server's disk is full. {ADVICE}")


def check_quota(
    session: Session, settings: Settings, store: UploadStore, staged: Iterable[Staged]
) -> None:
    """Raise 507 when committing the new (not yet stored) files would pass the quota."""
    new = {s.sha256: s.size_bytes for s in staged if not store.exists(s.sha256)}
    adding = sum(new.values())
    if adding and store.on_local_disk and shutil.disk_usage(store.root).free < adding:
        raise disk_full_error()
    limit = settings.max_data_bytes
    if not limit or not adding:
        return
    used = int(session.scalar(select(func.coalesce(func.sum(Upload.size_bytes), 0))) or 0)
    if used + adding > limit:
        raise ApiError(
            507,
            "insufficient_storage",
            f"the upload store is full: {used} of {limit} bytes used, this upload needs "
            f"{adding} more. Nothing was stored. {ADVICE}",
        )


def commit_upload(session: Session, store: UploadStore, staged: Staged) -> str:
    """Commit a staged file (database blobs in `session`'s transaction); a full disk or
    database is a 507, and nothing of this upload is kept."""
    try:
        return store.commit(staged, session=session)
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full_error() from exc
        raise
