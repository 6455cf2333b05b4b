"""`fork_map` and `side_by_side`: independent runs side by side, in forked children.

A distributed plan's figure is several runs that share nothing: each kind of rank, and
the two short depths a deep stack is scaled from. Each is a pure function of the model and
inputs (a fake copy is sharded and stepped), so a child forked from this process can run
it and send back its result; on N cores the runs take about 1/N of the time. Children run
torch on one thread (as a forked pass does: inspector/isolation.py) and die with us.
Runs stay in this process where forking is not safe or not worth it: one item, one core,
another (non-daemon) thread running (a fork would copy its locks), CUDA, or inside a
child already.

`side_by_side` keeps this process working too: the runs marked worth a fork are queued,
and a forked worker per spare core and this process (once it has run the rest) each take
the next queued run as soon as they are free. The memory pass runs its fake reruns so:
a child forked per run could only be started between this process's own runs, so a
spare core sat idle while this process ran a long one.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["fork_map", "side_by_side", "Outcome", "ForkedRunFailed", "FORK_WORTH_SECONDS"]

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


@dataclass
class Outcome:
    """What one run returned, or what it raised (`get` raises it again)."""

    value: Any = None
    error: BaseException | None = None

    def get(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def side_by_side(runs: Sequence[tuple[Callable[[], Any], bool]]) -> list[Outcome]:
    """Each run's outcome, in order. A run is (fn, worth a fork). The runs worth a fork
    are queued (put the longest first); one forked worker per spare core takes the next
    from the queue as soon as it is free, and this process, once it has run the others,
    takes from the same queue. Everything runs here where forking is not safe or there
    is one core."""
    slots = _workers(len(runs)) - 1
    queued = [i for i, (_, worth) in enumerate(runs) if worth] if slots and _may_fork() else []
    outcomes: dict[int, Outcome] = {}
    if not queued:
        return [_here(fn) for fn, _ in runs]
    queue = _Queue(queued)
    workers = []
    for _ in range(min(slots, len(queued))):
        try:
            workers.append(_Worker(runs, queue))
        except OSError:  # no fork (out of processes or memory): the queue is run here
            break
    for i in (i for i in range(len(runs)) if i not in queued):
        outcomes[i] = _here(runs[i][0])
    while (i := queue.take()) is not None:
        outcomes[i] = _here(runs[i][0])
    queue.close()
    for worker in workers:
        outcomes.update(worker.outcomes())
    lost = ForkedRunFailed("a forked worker ended without recording this run")
    return [outcomes.get(i) or Outcome(error=lost) for i in range(len(runs))]


class _Queue:
    """Run indices in a pipe that this process and its forked workers read from: a read
    of one index is atomic, so each run is taken once, by whoever is free first."""

    _INDEX = struct.Struct("<i")

    def __init__(self, indices: list[int]) -> None:
        self._read, write = os.pipe()
        os.write(write, b"".join(self._INDEX.pack(i) for i in indices))  # < 64 KiB: no wait
        os.close(write)  # the queue is full: once empty, a read says so at once
        os.set_blocking(self._read, False)

    def take(self) -> int | None:
        try:
            data = os.read(self._read, self._INDEX.size)
        except BlockingIOError:
            return None
        return self._INDEX.unpack(data)[0] if data else None

    def close(self) -> None:
        os.close(self._read)


class _Worker:
    """A forked child that runs queued runs until the queue is empty. It writes each
    index before its run and the outcome after it to a file of its own (no pipe to fill
    while this process is busy), so a crash is charged to the run it was in."""

    def __init__(self, runs: Sequence[tuple[Callable[[], Any], bool]], queue: _Queue) -> None:
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by `outcomes`, after the exit
        try:
            self.pid = os.fork()
        except OSError:
            self._log.close()
            raise
        if self.pid == 0:
            _work(runs, queue, self._log)

    def outcomes(self) -> dict[int, Outcome]:
        _, status = os.waitpid(self.pid, 0)
        self._log.seek(0)
        out: dict[int, Outcome] = {}
        running = None
        with self._log:
            while True:
                try:
                    kind, i, value = pickle.load(self._log)
                except (EOFError, pickle.UnpicklingError):  # the end, or a crash mid-write
                    break
                if kind == "taking":
                    running = i
                    continue
                running = None
                out[i] = Outcome(value) if kind == "ok" else Outcome(error=_raised(*value))
        if running is not None:
            how = _ended(status)
            out[running] = Outcome(
                error=ForkedRunFailed(f"a forked run ended without a result ({how})")
            )
        return out


def _ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.WEXITSTATUS(status) if os.WIFEXITED(status) else status}"


def _work(runs: Sequence[tuple[Callable[[], Any], bool]], queue: _Queue, log: Any) -> None:
    """The worker's life: run, record, exit without running the parent's cleanup, and
    never return into the parent's code, whatever fails (a full disk under the log)."""
    global _in_child
    _in_child = True
    code = 0
    try:
        from inspector.isolation import become_child

        become_child()
        while (i := queue.take()) is not None:
            pickle.dump(("taking", i, None), log)
            log.flush()
            try:
                record = ("ok", i, runs[i][0]())
                payload = pickle.dumps(record)
            except BaseException as exc:  # noqa: BLE001 - the parent raises it
                text = "".join(traceback.format_exception(exc))
                payload = pickle.dumps(("raised", i, (text, _sendable(exc))))
            log.write(payload)
            log.flush()
    except BaseException:  # noqa: BLE001 - the run in hand is charged as a crash
        code = 1
    finally:
        os._exit(code)


def _raised(text: str, original: BaseException | None) -> BaseException:
    """A worker's exception as itself where it survived the pickle, else as text."""
    return original if original is not None else _failed(text)


def _failed(text: str) -> ForkedRunFailed:
    """A child's exception, by its traceback's text."""
    last = text.strip().splitlines()[-1] if text.strip() else "an exception"
    return ForkedRunFailed(f"a forked run raised {last}\n{text}")


def _here(fn: Callable[[], Any]) -> Outcome:
    try:
        return Outcome(fn())
    except Exception as exc:  # noqa: BLE001 - the caller decides, as with a child's
        return Outcome(error=exc)


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
            text = "".join(traceback.format_exception(exc))
            payload = pickle.dumps(("raised", text))
            code = 1
        with os.fdopen(write_fd, "wb") as out:
            out.write(payload)
        os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _sendable(exc: BaseException) -> BaseException | None:
    """`exc` where it survives a pickle round trip (an exception whose __init__ takes
    other arguments than its args does not), for `side_by_side` to give back as it was."""
    try:
        back = pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001
        return None
    return exc if type(back) is type(exc) and back.args == exc.args else None


def _collect(pid: int, read_fd: int) -> Any:
    with os.fdopen(read_fd, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise ForkedRunFailed(f"a forked run ended without a result ({_ended(status)})")
    kind, value = pickle.loads(data)
    if kind == "raised":
        raise _failed(value)
    return value
