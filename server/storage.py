"""Content-addressed upload store: `<root>/uploads/ab/cdef...`, written atomically.

An upload is first staged (streamed to a temp file while hashed and counted), checked,
then committed with one rename: the store never holds a half-written or unchecked file.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["UploadStore", "Staged", "TooLarge", "iter_file"]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1024 * 1024


class TooLarge(Exception):
    """A stream passed the byte limit it was given."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} bytes")
        self.limit = limit


@dataclass
class Staged:
    path: Path  # the temp file, until committed
    sha256: str
    size_bytes: int


def iter_file(f: BinaryIO, chunk: int = CHUNK) -> Iterator[bytes]:
    while data := f.read(chunk):
        yield data


class UploadStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.dir = self.root / "uploads"
        self.tmp = self.root / "tmp"  # same filesystem as `dir`, so the rename is atomic

    def path(self, sha256: str) -> Path:
        if not _SHA256.match(sha256):
            raise ValueError(f"not a sha256: {sha256!r}")
        return self.dir / sha256[:2] / sha256[2:]

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

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
            digest, size = _copy_hashing(chunks, fd, limit)
            yield Staged(Path(name), digest, size)
        finally:
            if os.path.exists(name):
                os.unlink(name)

    def commit(self, staged: Staged) -> str:
        final = self.path(staged.sha256)
        if not final.exists():  # the same content may be stored already
            final.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(staged.path, 0o644)  # readable by the sandbox's unprivileged uid
            os.replace(staged.path, final)
        return staged.sha256


def _copy_hashing(chunks: Iterable[bytes], fd: int, limit: int | None) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "wb") as out:
        for chunk in chunks:
            size += len(chunk)
            if limit is not None and size > limit:
                raise TooLarge(limit)
            digest.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest(), size
