"""Streaming copies that hash and count as they go: no file ever sits whole in memory."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["CHUNK_BYTES", "Staged", "TooLarge", "copy_hashing", "iter_file"]

CHUNK_BYTES = 1024 * 1024


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


def iter_file(f: BinaryIO, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
    while data := f.read(chunk):
        yield data


def copy_hashing(chunks: Iterable[bytes], fd: int, limit: int | None = None) -> tuple[str, int]:
    """Write `chunks` to `fd` (closed afterwards) and fsync; returns (sha256, size).
    Raises `TooLarge` past `limit`."""
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
