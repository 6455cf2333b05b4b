"""The database backend: blobs as rows of 1 MiB chunks (`blobs`, `blob_chunks`), on SQLite
and PostgreSQL alike, so workers on other hosts need only the database URL.

A blob row and all its chunks are written in one transaction (with the caller's session,
the same one as the upload's job row): a blob is complete or absent. Reads and writes go
chunk by chunk, so a 1 GB file never sits whole in memory on either side.
"""

from __future__ import annotations

import datetime as dt
import errno
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sqlalchemy import Connection, Engine, delete, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from server.blobs.errors import BlobMissing, check_sha256
from server.blobs.streams import CHUNK_BYTES, Staged, iter_file
from server.models import Blob, BlobChunk, utcnow

__all__ = ["DatabaseBlobs"]

_BATCH = 500  # sha256s per IN (...) query


class DatabaseBlobs:
    def __init__(self, engine: Engine, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.engine = engine
        self.chunk_bytes = chunk_bytes

    def exists(self, sha256: str) -> bool:
        return sha256 in self.stored([check_sha256(sha256)])

    def stored(self, sha256s: Iterable[str]) -> set[str]:
        """The ones among `sha256s` that are in the store."""
        names = list(sha256s)
        found: set[str] = set()
        with self.engine.connect() as conn:
            for i in range(0, len(names), _BATCH):
                query = select(Blob.sha256).where(Blob.sha256.in_(names[i : i + _BATCH]))
                found.update(conn.scalars(query))
        return found

    def put(self, staged: Staged, *, session: Session | None = None) -> bool:
        """Store a staged file (True), or only mark the stored copy as put again (False).
        With `session`, inside its transaction: stored when, and only if, it commits."""
        check_sha256(staged.sha256)
        try:
            if session is not None:
                return self._write(session.connection(), staged)
            with self.engine.begin() as conn:
                return self._write(conn, staged)
        except DBAPIError as exc:
            if _is_disk_full(exc):  # the API answers 507, as for a full disk
                raise OSError(errno.ENOSPC, f"the database is full: {exc.orig}") from exc
            raise

    def _write(self, conn: Connection, staged: Staged) -> bool:
        now = utcnow()
        again = update(Blob).where(Blob.sha256 == staged.sha256).values(touched_at=now)
        if conn.execute(again).rowcount:
            return False
        row = {"sha256": staged.sha256, "size_bytes": staged.size_bytes, "touched_at": now}
        row["chunk_count"] = -(-staged.size_bytes // self.chunk_bytes)  # ceil; 0 for 0 bytes
        if conn.execute(_insert_new(conn, row).returning(Blob.sha256)).scalar() is None:
            return False  # a concurrent upload of the same content stored it first
        written = 0
        with open(staged.path, "rb") as f:
            for seq, data in enumerate(iter_file(f, self.chunk_bytes)):
                conn.execute(insert(BlobChunk), {"sha256": staged.sha256, "seq": seq, "data": data})
                written += len(data)
        if written != staged.size_bytes:  # raising rolls the whole blob back
            raise ValueError(f"{staged.path} has {written} bytes, {staged.size_bytes} staged")
        return True

    def read_chunks(self, sha256: str) -> Iterator[bytes]:
        """The blob's bytes, one chunk at a time; `BlobMissing` if it is not (all) there."""
        check_sha256(sha256)
        with self.engine.connect() as conn:
            query = select(Blob.chunk_count).where(Blob.sha256 == sha256)
            count = conn.scalar(query)
            if count is None:
                raise BlobMissing(f"blob {sha256} is not in the database's blob store")
            for seq in range(count):
                query = select(BlobChunk.data).where(
                    BlobChunk.sha256 == sha256, BlobChunk.seq == seq
                )
                data = conn.scalar(query)
                if data is None:
                    raise BlobMissing(f"blob {sha256}: chunk {seq} of {count} is gone (deleted?)")
                yield bytes(data)

    def delete(
        self,
        sha256: str,
        *,
        unless_put_since: dt.datetime | None = None,
        still_used: Callable[[Connection, str], bool] | None = None,
    ) -> bool:
        """Delete the blob (True); kept when put again at or after `unless_put_since`, or
        when `still_used` says so, asked once the blob's row is locked."""
        query = delete(Blob).where(Blob.sha256 == check_sha256(sha256))
        if unless_put_since is not None:
            query = query.where(Blob.touched_at < unless_put_since)
        with self.engine.begin() as conn:
            # Lock first: an upload of the same file that has touched the row but not yet
            # committed its job holds the lock; `still_used` then sees that job.
            lock = update(Blob).where(Blob.sha256 == sha256).values(touched_at=Blob.touched_at)
            if conn.execute(lock).rowcount != 1:
                return False
            if still_used is not None and still_used(conn, sha256):
                return False
            if conn.execute(query).rowcount != 1:
                return False
            # The foreign key cascades; said again for a SQLite opened without the pragma.
            conn.execute(delete(BlobChunk).where(BlobChunk.sha256 == sha256))
        return True


def _insert_new(conn: Connection, row: dict[str, Any]) -> Any:
    """INSERT that does nothing when the sha256 is there (two uploads of one file at once):
    Postgres waits for the other transaction, then finds its row."""
    dialect = conn.dialect.name
    if dialect not in ("postgresql", "sqlite"):
        return insert(Blob).values(**row)
    insert_for = pg_insert if dialect == "postgresql" else sqlite_insert
    return insert_for(Blob).values(**row).on_conflict_do_nothing(index_elements=["sha256"])


def _is_disk_full(exc: DBAPIError) -> bool:
    if getattr(exc.orig, "sqlstate", None) == "53100":  # Postgres: disk_full
        return True
    return "database or disk is full" in str(exc.orig)  # SQLite: SQLITE_FULL
