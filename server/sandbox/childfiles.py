"""Reading what the child wrote, without trusting it: no links, no FIFOs, bounded sizes."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any

__all__ = ["read_child_file", "read_child_json", "ProgressReader"]


def read_child_file(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of a regular file at `path` (not a link, FIFO or device), or None when
    absent, of another kind, or larger than `max_bytes`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = f.read(max_bytes + 1)
    return data if len(data) <= max_bytes else None


def read_child_json(path: Path, max_bytes: int) -> dict[str, Any] | None:
    data = read_child_file(path, max_bytes)
    if data is None:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class ProgressReader:
    """Follows `progress.jsonl` as the child appends `{"stage", "percent", "t"}` lines."""

    MAX_READ = 64 * 1024  # per poll; a child spamming the file cannot stall the watchdog

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.pending = b""
        self.stage: str | None = None
        self.percent = 0
        self.times: dict[str, float] = {}  # first time each stage was seen (child's clock)

    def poll(self) -> bool:
        """Read new lines; True when the stage or percent changed."""
        chunk = self._read()
        if not chunk:
            return False
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()[-4096:]
        before = (self.stage, self.percent)
        for line in lines:
            self._take(line)
        return (self.stage, self.percent) != before

    def _read(self) -> bytes:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return b""
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return b""
            f.seek(self.offset)
            chunk = f.read(self.MAX_READ)
        self.offset += len(chunk)
        return chunk

    def _take(self, line: bytes) -> None:
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            item = json.loads(line)
            stage, percent = str(item["stage"])[:64], int(item["percent"])
            self.stage, self.percent = stage, max(0, min(percent, 100))
            if isinstance(item.get("t"), int | float):
                self.times.setdefault(stage, float(item["t"]))
