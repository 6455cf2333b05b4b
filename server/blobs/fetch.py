"""How a worker finds a blob: its own `uploads/` directory (the local backend, or a volume
shared with the server), else its cache, else the database (copied into the cache).

A worker needs no setting for this: whichever backend the server writes to, a worker with
the same database URL finds the upload.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from server.blobs.cache import BlobCache, PruneResult
from server.blobs.database import DatabaseBlobs
from server.blobs.errors import BlobMissing
from server.blobs.local import LocalBlobs

__all__ = ["stored_file", "prune_cache"]


def stored_file(data_dir: Path, engine: Engine, *, sha256: str, what: str) -> Path:
    """A local path holding blob `sha256` (the stored `what`: "model", "input")."""
    local = LocalBlobs(data_dir)
    if local.exists(sha256):
        return local.path(sha256)
    database = DatabaseBlobs(engine)
    try:
        return BlobCache(data_dir).fetch(sha256, lambda: database.read_chunks(sha256))
    except BlobMissing as exc:
        raise BlobMissing(
            f"the stored {what} file {sha256[:12]}... is neither in {local.dir} nor in the "
            f"database's blob store ({exc}). It was deleted, or the server keeps uploads on "
            "its own disk: for workers on other hosts set INSPECTOR_BLOB_STORE=database on "
            "the server. Upload the file again."
        ) from None


def prune_cache(data_dir: Path, engine: Engine, *, max_bytes: int) -> PruneResult:
    """Drop this host's copies of blobs deleted from the database, then the least recently
    used past `max_bytes`."""
    return BlobCache(data_dir).prune(stored=DatabaseBlobs(engine).stored, max_bytes=max_bytes)
