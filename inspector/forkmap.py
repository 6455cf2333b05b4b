"""`fork_map`: independent fake-tensor runs side by side, one forked child each.

A distributed plan's figure is several runs that share nothing: each kind of rank, and
the two short depths a deep stack is scaled from. Each is a pure function of the model and
inputs (a fake copy is sharded and stepped), so a child forked from this process can run
it and send back its result; on N cores the runs take about 1/N of the time. Children run
torch on one thread (as a forked pass does: inspector/isolation.py) and die with us.
Runs stay in this process where forking is not safe or not worth it: one item, one core,
another (non-daemon) thread running (a fork would copy its locks), CUDA, or inside a
child already.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["fork_map", "fork_map_if_slow", "ForkedRunFailed"]

T = TypeVar("T")
R = TypeVar("R")

_in_child = False
FORK_WORTH_SECONDS = 0.25  # a run shorter than this is not faster in a forked child


class ForkedRunFailed(RuntimeError):
    """A forked run ended without a result (a signal, or an exception: its text)."""


def _workers(items: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(items, cores or 1, 8))


def _working_threads() -> bool:
    """Threads besides ours that may hold a lock a child would copy; daemon monitors (tqdm's,
    which transformers starts) only sleep, as in every forked pass."""
    main = threading.main_thread()
    return any(t is not main and not t.daemon for t in threading.enumerate())


def _may_fork() -> bool:
    if _in_child or not sys.platform.startswith("linux") or _working_threads():
        return False
    torch = sys.modules.get("torch")
    return not (torch is not None and torch.cuda.is_initialized())


def fork_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """[fn(x) for x in items], the runs in forked children when that helps."""
    workers = _workers(len(items))
    if workers < 2 or not _may_fork():
        return [fn(x) for x in items]
    results: list[Any] = [None] * len(items)
    for start in range(0, len(items), workers):
        batch = list(range(start, min(start + workers, len(items))))
        started = [(i, *_start(fn, items[i])) for i in batch]
        for i, pid, read_fd in started:
            results[i] = _collect(pid, read_fd)
    return results


def fork_map_if_slow(fn: Callable[[T], R], items: Sequence[T], seconds: float) -> list[R]:
    """`fork_map` where each run, about `seconds` long, is worth a fork: a child costs
    tens of milliseconds to fork and fault in, so a small model's 50 ms runs stay here."""
    if seconds < FORK_WORTH_SECONDS:
        return [fn(x) for x in items]
    return fork_map(fn, items)


def _start(fn: Callable[[Any], Any], item: Any) -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, send, exit without running the parent's cleanup
        global _in_child
        _in_child = True
        os.close(read_fd)
        code = 0
        try:
            from inspector.isolation import become_child

            become_child()
            payload = pickle.dumps(("ok", fn(item)))
        except BaseException as exc:  # noqa: BLE001 - the parent raises it
            payload = pickle.dumps(("raised", "".join(traceback.format_exception(exc))))
            code = 1
        with os.fdopen(write_fd, "wb") as out:
            out.write(payload)
        os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _collect(pid: int, read_fd: int) -> Any:
    with os.fdopen(read_fd, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {status}"
        raise ForkedRunFailed(f"a forked run ended without a result ({how})")
    kind, value = pickle.loads(data)
    if kind == "raised":
        last = value.strip().splitlines()[-1] if value.strip() else "an exception"
        raise ForkedRunFailed(f"a forked run raised {last}\n{value}")
    return value
