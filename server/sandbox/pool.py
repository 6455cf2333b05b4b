"""Which zygote serves this worker thread's next job.

One zygote per consumer thread (each runs one job at a time), started ahead of the job
(pre-warmed while the thread idles) and by that thread: bwrap's --die-with-parent follows
the thread that spawned it. It is replaced after `max_jobs` jobs or as soon as it fails;
when one cannot get ready the job runs as a fresh child, and after a few failures in a
row this thread stops trying (said once in the log).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from server.sandbox.limits import Limits
from server.sandbox.zygote import Zygote, ZygoteError

__all__ = ["ZygoteKey", "prewarm", "take", "give_back", "close_this_thread", "close_all"]

log = logging.getLogger(__name__)
MAX_FAILURES = 3


@dataclass(frozen=True)
class ZygoteKey:
    """What a zygote was started with: a job needing another one gets another zygote."""

    jobs_root: Path
    limits: Limits  # its priority and /tmp size; each child sets its own rlimits
    gpu: bool


class _Slot(threading.local):
    zygote: Zygote | None = None
    key: ZygoteKey | None = None
    failures: int = 0  # in a row, for `failed_key`
    failed_key: ZygoteKey | None = None


_slot = _Slot()
_all: set[Zygote] = set()
_all_lock = threading.Lock()


def prewarm(key: ZygoteKey) -> None:
    """Start this thread's zygote now (it gets ready on its own) unless one is there."""
    if _slot.failures >= MAX_FAILURES and _slot.failed_key == key:
        return
    if _slot.zygote is not None and _slot.key == key and _slot.zygote.alive:
        return
    _drop()
    try:
        zygote = Zygote.start(key.jobs_root, key.limits, gpu=key.gpu)
    except (OSError, ValueError) as exc:
        _failed(key, f"the zygote could not start: {exc}")
        return
    _slot.zygote, _slot.key = zygote, key
    with _all_lock:
        _all.add(zygote)


def take(
    key: ZygoteKey,
    ready_timeout_s: float,
    should_stop: Callable[[], bool] | None = None,
    on_tick: Callable[[], None] | None = None,
) -> tuple[Zygote | None, float]:
    """This thread's ready zygote (None: run a fresh child) and the seconds waited for it."""
    prewarm(key)
    zygote = _slot.zygote
    if zygote is None:
        return None, 0.0
    start = time.monotonic()
    fresh = zygote.info is None
    try:
        info = zygote.wait_ready(ready_timeout_s, should_stop, on_tick)
    except ZygoteError as exc:
        _drop()
        if not (should_stop is not None and should_stop()):
            _failed(key, str(exc))
        return None, time.monotonic() - start
    _slot.failures = 0
    if fresh:
        log.info("zygote ready: import %.1f s, warm-up %.1f s, %s modules learned",
                 info.get("import_s", 0), info.get("warmup_s", 0), info.get("modules"))  # fmt: skip
    return zygote, time.monotonic() - start


def give_back(zygote: Zygote, max_jobs: int) -> None:
    """After a job: count it; replace the zygote (now, while idle) when due or broken."""
    zygote.jobs_run += 1
    if zygote.broken or not zygote.alive or zygote.jobs_run >= max_jobs:
        key = _slot.key
        _drop()
        if key is not None:
            prewarm(key)


def _failed(key: ZygoteKey, why: str) -> None:
    if _slot.failed_key != key:
        _slot.failures, _slot.failed_key = 0, key
    _slot.failures += 1
    if _slot.failures >= MAX_FAILURES:
        log.error("zygote: %s; this worker thread runs fresh children from now on", why)
    else:
        log.warning("zygote: %s; this job runs as a fresh child", why)


def _drop() -> None:
    zygote, _slot.zygote, _slot.key = _slot.zygote, None, None
    if zygote is not None:
        zygote.close()
        with _all_lock:
            _all.discard(zygote)


def close_this_thread() -> None:
    """End this thread's zygote (its consumer loop is over)."""
    _drop()


def close_all() -> None:
    """End every zygote (the worker is stopping)."""
    with _all_lock:
        zygotes = list(_all)
        _all.clear()
    for zygote in zygotes:
        zygote.close()
