"""Capture a child's stream with a cap: keep its head and tail, drain and count the rest.

A child printing gigabytes must neither block (a full pipe stalls it) nor fill the
worker's memory or disk, so everything is read and only `2 * keep` bytes are kept.
"""

from __future__ import annotations

import threading
from typing import BinaryIO

__all__ = ["CappedStream"]

CHUNK = 64 * 1024


class CappedStream:
    def __init__(self, stream: BinaryIO, keep_bytes: int) -> None:
        self.keep = max(keep_bytes // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total_bytes = 0
        self._stream = stream
        self._thread = threading.Thread(target=self._drain, daemon=True, name="sandbox-output")
        self._thread.start()

    def _drain(self) -> None:
        try:
            while chunk := self._stream.read1(CHUNK):
                self._take(chunk)
        except (OSError, ValueError):  # closed under us
            pass
        finally:
            self._stream.close()

    def _take(self, chunk: bytes) -> None:
        self.total_bytes += len(chunk)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            del self.tail[: max(len(self.tail) - self.keep, 0)]

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def truncated(self) -> bool:
        return self.total_bytes > len(self.head) + len(self.tail)

    def text(self) -> str:
        """Head, a marker for what was dropped, tail; decoded leniently."""
        dropped = self.total_bytes - len(self.head) - len(self.tail)
        middle = f"\n[... {dropped} bytes not kept ...]\n".encode() if dropped > 0 else b""
        return bytes(self.head + middle + self.tail).decode("utf-8", "replace")
