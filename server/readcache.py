"""Done reports served from memory: their finished JSON and page bodies, gzipped once.

A done report never changes, so the body its endpoint builds (a megabyte of JSON, or the
rendered page) is kept per process and served as is: no database read, no rebuild, no
compression per request. Bounded by total bytes, least recently used out first. Only done
reports go in: a queued or running job's status must update live.

What a body depends on besides the slug is in its key (the base URL of the JSON's links;
whether the page lists other reports) or in its `tag` (the page's "compare with" list):
a kept body with another tag is built again, by one request, while the others still get
the previous body.

Deletion: the deleting process calls `drop(slug)`; elsewhere (another web process,
`inspector gc`) an entry older than the TTL is served again only once the database says
the report is still there and done. One request asks; while it waits for the answer, the
others still get the body (so a deleted report may be served for the TTL plus one query).
"""

from __future__ import annotations

import gzip
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request, Response

__all__ = ["CACHE_CONTROL", "Cached", "CacheKey", "ReadCache", "accepts_gzip", "cached_response"]

T = TypeVar("T")
CacheKey = tuple[str, str, str]  # (kind, slug, variant), e.g. ("json", slug, base URL)
ENTRY_OVERHEAD_BYTES = 512  # the key, the tags and the bookkeeping of one entry, roughly
FILL_LOCKS = 64  # one build at a time per key (keys share these locks by hash)
GZIP_LEVEL = 6
# A report is readable by anyone with its unguessable link, and may be confidential:
# `private` keeps it out of shared caches. `no-cache`: a browser keeps its copy but asks
# again each time with If-None-Match, answered by a 304 from memory; with a max-age it
# would go on showing a report that was deleted on the server.
CACHE_CONTROL = "private, no-cache"


@dataclass(frozen=True)
class Cached:
    """One finished body; `gzipped` is None when it is not kept (then not compressed)."""

    body: bytes
    media_type: str
    etag: str  # strong: a hash of `body`, quoted
    gzipped: bytes | None = None
    tag: str = ""

    @property
    def size(self) -> int:
        return len(self.body) + len(self.gzipped or b"") + ENTRY_OVERHEAD_BYTES

    @property
    def gzip_etag(self) -> str:
        return self.etag[:-1] + '-gzip"'  # another representation: a tag of its own


class ReadCache:
    """Finished bodies by key, at most `max_bytes` in all (0: nothing is kept)."""

    def __init__(
        self, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_bytes, self.ttl_s, self.clock = max_bytes, ttl_s, clock
        self.bytes = 0
        self._drops = 0
        self._entries: OrderedDict[CacheKey, tuple[Cached, float]] = OrderedDict()
        self._memos: dict[str, tuple[object, float]] = {}
        self._lock = threading.Lock()
        self._fills = [threading.Lock() for _ in range(FILL_LOCKS)]
        self._memo_lock = threading.Lock()
        self._checking: set[CacheKey] = set()  # entries past the TTL being checked now

    def entry(self, body: bytes, media_type: str, *, tag: str = "") -> Cached:
        """A done report's body as it will be kept: gzipped once, with its ETag."""
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        kept = len(body) + ENTRY_OVERHEAD_BYTES <= self.max_bytes
        gzipped = gzip.compress(body, GZIP_LEVEL, mtime=0) if kept else None
        return Cached(body, media_type, etag, gzipped, tag)

    def fetch(
        self,
        key: CacheKey,
        build: Callable[[], Cached | T],
        *,
        still_done: Callable[[], bool],
        tag: str = "",
    ) -> Cached | T:
        """The kept body for `key` and `tag`, else what `build()` returns (a `Cached` is
        kept). `still_done()` asks the database about an entry older than the TTL."""
        if self.max_bytes <= 0:
            return build()
        found = self._usable(key, still_done)
        if found is not None and found.tag == tag:
            return found
        fill = self._fills[hash(key) % FILL_LOCKS]
        if not fill.acquire(blocking=found is None):
            return found  # another request builds it again; the previous body meanwhile
        try:
            again = self._fresh(key)
            if again is not None and again.tag == tag:  # built while this one waited
                return again
            drops = self._drops
            built = build()
            if isinstance(built, Cached) and drops == self._drops:  # else maybe deleted since
                self._put(key, built)
            return built
        finally:
            fill.release()

    def peek(self, key: CacheKey, tag: str = "") -> Cached | None:
        """The kept body for `key` and `tag` if it needs no database check (within the TTL),
        else None. It never waits for a build: fit for the event loop."""
        with self._lock:
            item = self._entries.get(key)
            if item is None or item[0].tag != tag:
                return None
            if self.clock() - item[1] >= self.ttl_s and key not in self._checking:
                return None
            self._entries.move_to_end(key)
        return item[0]

    def drop(self, slug: str) -> int:
        """Forget every body of report `slug`; returns how many there were."""
        with self._lock:
            self._drops += 1  # a body being built now is not kept: it may predate the delete
            keys = [key for key in self._entries if key[1] == slug]
            for key in keys:
                self.bytes -= self._entries.pop(key)[0].size
        return len(keys)

    def peek_memo(self, name: str, ttl_s: float) -> Any:
        """The value `memo` would return without computing it, else None."""
        item = self._memos.get(name)
        fresh = self.max_bytes > 0 and item is not None and self.clock() - item[1] < ttl_s
        return item[0] if fresh else None  # type: ignore[index]

    def memo(self, name: str, ttl_s: float, compute: Callable[[], T]) -> T:
        """A small value (outside the byte bound) computed at most every `ttl_s`, by one
        request at a time: the others get the previous value meanwhile, or wait for the first."""
        if self.max_bytes <= 0:
            return compute()
        item = self._memos.get(name)
        if item is not None and self.clock() - item[1] < ttl_s:
            return item[0]  # type: ignore[return-value]
        if not self._memo_lock.acquire(blocking=item is None):
            return item[0]  # type: ignore[union-attr]
        try:
            again = self._memos.get(name)
            if again is not None and self.clock() - again[1] < ttl_s:  # computed meanwhile
                return again[0]  # type: ignore[return-value]
            value = compute()
            self._memos[name] = (value, self.clock())
            return value
        finally:
            self._memo_lock.release()

    def __len__(self) -> int:
        return len(self._entries)

    def _fresh(self, key: CacheKey) -> Cached | None:
        with self._lock:
            item = self._entries.get(key)
        return item[0] if item is not None and self.clock() - item[1] < self.ttl_s else None

    def _usable(self, key: CacheKey, still_done: Callable[[], bool]) -> Cached | None:
        with self._lock:
            item = self._entries.get(key)
            if item is None:
                return None
            self._entries.move_to_end(key)  # most recently used last
        entry, checked_at = item
        if self.clock() - checked_at < self.ttl_s:
            return entry
        with self._lock:
            if key in self._checking:  # one request asks the database; the others meanwhile
                return entry
            self._checking.add(key)
        try:
            done = still_done()
        finally:
            with self._lock:
                self._checking.discard(key)
        if not done:  # deleted (here or by another process): forget all its bodies
            self.drop(key[1])
            return None
        with self._lock:
            if self._entries.get(key, (None,))[0] is entry:
                self._entries[key] = (entry, self.clock())
        return entry

    def _put(self, key: CacheKey, entry: Cached) -> None:
        if entry.size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[0].size
            self._entries[key] = (entry, self.clock())
            self.bytes += entry.size
            while self.bytes > self.max_bytes:  # least recently used first
                self.bytes -= self._entries.popitem(last=False)[1][0].size


def accepts_gzip(header: str | None) -> bool:
    """Whether an Accept-Encoding value allows gzip (`gzip;q=0` refuses it, `*` allows it)."""
    weights: dict[str, float] = {}
    for part in (header or "").split(","):
        name, _, params = part.partition(";")
        weight = 1.0
        key, _, value = params.partition("=")
        if key.strip().lower() == "q":
            try:
                weight = float(value)
            except ValueError:
                weight = 0.0
        weights[name.strip().lower()] = weight
    weight = weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0)))
    return weight > 0


def _not_modified(header: str | None, entry: Cached) -> bool:
    # If-None-Match uses the weak comparison (RFC 9110 13.1.2); either coding of the body
    # is the same report.
    tags = {t.strip().removeprefix("W/") for t in (header or "").split(",") if t.strip()}
    return "*" in tags or bool(tags & {entry.etag, entry.gzip_etag})


def cached_response(request: Request, entry: Cached) -> Response:
    """A kept body: gzipped when the client accepts gzip; 304 when its copy is current."""
    zipped = entry.gzipped is not None and accepts_gzip(request.headers.get("accept-encoding"))
    etag = entry.gzip_etag if zipped else entry.etag
    headers = {"ETag": etag, "Cache-Control": CACHE_CONTROL, "Vary": "Accept-Encoding"}
    if _not_modified(request.headers.get("if-none-match"), entry):
        return Response(status_code=304, headers=headers)
    if zipped:
        headers["Content-Encoding"] = "gzip"
    body = entry.gzipped if zipped else entry.body
    return Response(body, media_type=entry.media_type, headers=headers)
