"""A worker's local copies of blobs, by hash: `<data_dir>/blob-cache/ab/cdef...`.

A copy is downloaded to a temp file beside the cache, its sha256 checked, then published
with one rename. So a worker killed mid-download leaves at most a temp file (never a file
under a blob's name), and two workers or jobs fetching the same blob at once each write
their own temp file and both succeed: the second rename swaps in identical bytes.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from server.blobs.errors import BlobCorrupt, check_sha256
from server.blobs.streams import copy_hashing

__all__ = ["BlobCache", "PruneResult"]

PARTIAL_MAX_AGE_S = 3600  # a download still running writes at least this often
KEEP_RECENT_S = 600  # copies used this recently stay: a job may be copying from them


@dataclass
class PruneResult:
    removed: list[str]
    bytes_freed: int
    partials: int  # temp files of downloads that died


class BlobCache:
    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir) / "blob-cache"
        self.partial = self.dir / "partial"  # same filesystem: the rename is atomic

    def path(self, sha256: str) -> Path:
        check_sha256(sha256)
        return self.dir / sha256[:2] / sha256[2:]

    def fetch(self, sha256: str, read: Callable[[], Iterable[bytes]]) -> Path:
        """The local copy of blob `sha256`, downloaded with `read()` unless already here."""
        final = self.path(sha256)
        if final.is_file():
            os.utime(final)  # recently used: pruned last
            return final
        self.partial.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.partial, prefix=f"{sha256[:12]}-")
        try:
            digest, size = copy_hashing(read(), fd)
            if digest != sha256:
                raise BlobCorrupt(f"blob {sha256} read back as {size} bytes hashing to {digest}")
            os.chmod(name, 0o644)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(name, final)
        finally:
            if os.path.exists(name):
                os.unlink(name)
        return final

    def entries(self) -> list[tuple[str, int, float]]:
        """(sha256, size, last used) of every published copy."""
        found = []
        for path in self.dir.glob("[0-9a-f][0-9a-f]/*"):
            try:
                sha, stat = check_sha256(path.parent.name + path.name), path.stat()
                found.append((sha, stat.st_size, stat.st_mtime))
            except (ValueError, FileNotFoundError):
                continue
        return found

    def prune(self, *, stored: Callable[[list[str]], set[str]], max_bytes: int) -> PruneResult:
        """Remove copies of blobs no longer `stored`, then the least recently used past
        `max_bytes` (0: no limit), and temp files of dead downloads. Copies used in the last
        KEEP_RECENT_S stay whatever the rest says."""
        now = time.time()
        entries = sorted(self.entries(), key=lambda e: e[2])  # least recently used first
        still = stored([sha for sha, _, _ in entries]) if entries else set()
        total = sum(size for _, size, _ in entries)
        result = PruneResult([], 0, self._prune_partials(now))
        for sha, size, used in entries:
            over = max_bytes and total > max_bytes
            if now - used < KEEP_RECENT_S or (sha in still and not over):
                continue
            try:
                self.path(sha).unlink()
            except FileNotFoundError:
                continue
            total -= size
            result.removed.append(sha)
            result.bytes_freed += size
        return result

    def _prune_partials(self, now: float) -> int:
        count = 0
        for path in self.partial.glob("*") if self.partial.is_dir() else ():
            try:
                if now - path.stat().st_mtime > PARTIAL_MAX_AGE_S:
                    path.unlink()
                    count += 1
            except FileNotFoundError:
                continue
        return count
