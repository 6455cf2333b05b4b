"""Uploads: staged on local disk (streamed to a temp file while hashed and counted), checked,
then committed to the blob store (`server.blobs`) the settings name.

Writes go to one backend, `INSPECTOR_BLOB_STORE` (`local`: `<data_dir>/uploads/ab/cdef...`;
`database`: chunks in the database). Lookups and deletions cover both, so uploads stored
before the setting changed stay reachable and collectable. Neither backend ever holds a
half-written or unchecked file.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from server.blobs.local import LocalBlobs
from server.blobs.streams import CHUNK_BYTES, Staged, TooLarge, copy_hashing, iter_file

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine
    from sqlalchemy.orm import Session

    from server.blobs.database import DatabaseBlobs
    from server.settings import Settings

__all__ = ["UploadStore", "Staged", "TooLarge", "iter_file", "CHUNK", "open_store"]

CHUNK = CHUNK_BYTES


class UploadStore:
    def __init__(
        self,
        root: Path,
        *,
        database: DatabaseBlobs | None = None,
        write_to: Literal["local", "database"] = "local",
    ) -> None:
        if write_to == "database" and database is None:
            raise ValueError("write_to='database' needs a DatabaseBlobs")
        self.root = Path(root)
        self.local = LocalBlobs(self.root)
        self.database = database
        self.write_to = write_to
        self.dir = self.local.dir
        self.tmp = self.root / "tmp"  # same filesystem as `dir`, so the rename is atomic

    @property
    def on_local_disk(self) -> bool:
        """Whether new uploads take space in the data dir (the disk-full check applies)."""
        return self.write_to == "local"

    def path(self, sha256: str) -> Path:
        """Where the local backend keeps `sha256` (whether or not it is there)."""
        return self.local.path(sha256)

    def exists(self, sha256: str) -> bool:
        if self.local.exists(sha256):
            return True
        return self.database is not None and self.database.exists(sha256)

    def put_bytes(self, data: bytes) -> str:
        with self.staging([data]) as staged:
            return self.commit(staged)

    @contextmanager
    def staging(self, chunks: Iterable[bytes], limit: int | None = None) -> Iterator[Staged]:
        """Stream to a temp file (raises `TooLarge` past `limit`); removed on exit unless
        `commit` moved it into the store."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.tmp, prefix="up-")
        try:
            digest, size = copy_hashing(chunks, fd, limit)
            yield Staged(Path(name), digest, size)
        finally:
            if os.path.exists(name):
                os.unlink(name)

    def commit(self, staged: Staged, *, session: Session | None = None) -> str:
        """Store a staged file in the configured backend. The database backend writes in
        `session`'s transaction when given: the blob commits with the upload's rows."""
        if self.write_to == "database":
            assert self.database is not None
            self.database.put(staged, session=session)
        else:
            self.local.put(staged)
        return staged.sha256

    def delete(
        self,
        sha256: str,
        *,
        unless_put_since: dt.datetime | None = None,
        still_used: Callable[[Connection, str], bool] | None = None,
    ) -> bool:
        """Delete `sha256` from both backends; a copy put again since `unless_put_since`
        stays, and one that `still_used` names (a database blob is locked first; a file
        cannot be, so it is asked just before the unlink). True when something went."""
        deleted = False
        if self.local.exists(sha256) and not self._used_now(sha256, still_used):
            deleted = self.local.delete(sha256, unless_put_since=unless_put_since)
        if self.database is not None:
            options = {"unless_put_since": unless_put_since, "still_used": still_used}
            deleted = self.database.delete(sha256, **options) or deleted
        return deleted

    def _used_now(self, sha256: str, still_used: Callable[[Connection, str], bool] | None) -> bool:
        if still_used is None or self.database is None:
            return False
        with self.database.engine.connect() as conn:
            return still_used(conn, sha256)


def open_store(settings: Settings, engine: Engine) -> UploadStore:
    """The upload store the settings describe, on `engine`'s database."""
    from server.blobs.database import DatabaseBlobs

    return UploadStore(
        settings.data_dir, database=DatabaseBlobs(engine), write_to=settings.blob_store
    )
