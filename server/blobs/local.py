"""The directory backend: one file per blob at `<data_dir>/uploads/ab/cdef...`.

The default, and what `inspector serve` on one machine uses: a worker reads the file in
place. A blob is published with one rename from a staging file on the same filesystem,
so the directory never holds a half-written file.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path

from server.blobs.errors import check_sha256
from server.blobs.streams import Staged

__all__ = ["LocalBlobs"]


class LocalBlobs:
    def __init__(self, root: Path) -> None:
        self.dir = Path(root) / "uploads"

    def path(self, sha256: str) -> Path:
        check_sha256(sha256)
        return self.dir / sha256[:2] / sha256[2:]

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def put(self, staged: Staged) -> bool:
        """Move a staged file in (True), or keep the copy already there (False)."""
        final = self.path(staged.sha256)
        if final.exists():
            # A fresh mtime: `inspector gc` spares blobs put again within its grace period,
            # so an upload racing with a delete of the same content keeps its file.
            os.utime(final)
            return False
        final.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(staged.path, 0o644)  # readable by the sandbox's unprivileged uid
        os.replace(staged.path, final)
        return True

    def delete(self, sha256: str, *, unless_put_since: dt.datetime | None = None) -> bool:
        """Remove the file (True); kept when put again at or after `unless_put_since`."""
        path = self.path(sha256)
        try:
            if unless_put_since is not None and _mtime(path) >= unless_put_since:
                return False
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def listing(self) -> Iterator[tuple[str, int, dt.datetime]]:
        """(sha256, size, last put) of every blob file."""
        if not self.dir.is_dir():
            return
        for sub in self.dir.iterdir():
            for path in sub.iterdir() if sub.is_dir() else ():
                sha = sub.name + path.name
                try:
                    check_sha256(sha)
                    yield sha, path.stat().st_size, _mtime(path)
                except (ValueError, FileNotFoundError):  # not ours, or deleted meanwhile
                    continue


def _mtime(path: Path) -> dt.datetime:
    return dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)
