"""Passes in forked children: a native crash (SIGSEGV, SIGABRT) costs only the pass it hit.

Each pass runs in a child forked from the process that holds the state after the pass
before it. A child that finishes its pass carries on with the next passes (forking again
for each), so every pass sees exactly what the earlier ones left, as when they all run in
one process. A child killed by a signal is noticed by its parent, which still holds the
state from before that pass: it marks the pass failed (signal, and where faulthandler saw
it) in the report and goes on with the next pass. The process that runs out of passes
writes the report (or the exception a pass raised) to a file the caller reads; progress
lines reach the caller through a pipe, and then a line saying the outcome is written: the
caller takes it at once, without waiting for the chain of children to exit, each after
its child (their exits took 87 ms of ResNet-18's report: each frees the pages it touched).
The caller's own child is reaped later (`_reap_exited`).

Limits, each checked by `isolation_mode`:
- a forked child must not use the OpenMP threads of its parent (libgomp deadlocks), so it
  runs torch on one intra-op thread: free on fake tensors (nothing is computed) and when the
  run is single-threaded anyway, otherwise a real run would be slower, and stays in one
  process unless isolation is asked for;
- CUDA cannot be used in a forked child: CUDA runs stay in one process;
- Linux only (fork with a parent-death signal).
The service's sandboxed job child is the outer net: a crash there fails the whole job.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import os
import pickle
import select
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from inspector import beside

__all__ = [
    "isolation_mode", "run_passes", "SelectedPass", "signal_reason", "RemoteTraceback",
    "become_child", "raised_outcome",
]  # fmt: skip

# (name, run, percent shown when it starts, whether it runs torch on the model: forked;
# a callable answers from the state the passes before it left, asked when it is reached)
SelectedPass = tuple[str, Callable[[Any], None], int, bool | Callable[[Any], bool]]
Notify = Callable[[str, int], None]
Timed = Callable[[str], Any]
Finish = Callable[[Any], None]

_PR_SET_PDEATHSIG = 1
_OUTCOME_WRITTEN = b"= outcome"  # the pipe's line once the outcome file is in place
_exiting: list[int] = []  # children whose outcome was taken before they exited
_TRACE_LINES = 6  # faulthandler lines kept in the report: the innermost frames


def isolation_mode(isolate: bool | None, fake: bool, device: str) -> tuple[bool, str]:
    """(isolate?, why) for these options; `isolate` None decides by cost."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False, "off: needs fork on Linux"
    if device == "cuda":
        return False, "off: CUDA cannot be used in a forked child"
    if isolate is not None:
        return isolate, "fork per pass" if isolate else "off: not asked for"
    import torch

    if fake or torch.get_num_threads() == 1:
        return True, "fork per pass"
    return False, "off: a real multi-threaded run would lose its threads in forked children"


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a pass's child, as its `__cause__`."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


@dataclass
class _Channel:
    top_pid: int
    read_fd: int
    write_fd: int
    result_path: str
    pending: bytes = b""
    outcome_written: bool = False  # a child said so through the pipe

    @classmethod
    def open(cls) -> _Channel:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        handle, path = tempfile.mkstemp(prefix="inspector-passes-", suffix=".pkl")
        os.close(handle)
        os.unlink(path)  # the finishing process creates it
        return cls(os.getpid(), read_fd, write_fd, path)

    def progress(self, stage: str, percent: int) -> None:
        line = f"{percent} {stage}\n".encode()[:512]  # one write under PIPE_BUF: atomic
        with suppress(OSError):  # the caller is gone: nothing to tell
            os.write(self.write_fd, line)

    def drain(self, notify: Notify) -> None:
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                return
            *lines, self.pending = (self.pending + chunk).split(b"\n")
            for line in lines:
                if line == _OUTCOME_WRITTEN:
                    self.outcome_written = True
                    continue
                percent, _, stage = line.decode(errors="replace").partition(" ")
                notify(stage, int(percent))

    def put(self, outcome: tuple[str, Any]) -> None:
        tmp = f"{self.result_path}.{os.getpid()}"
        with open(tmp, "wb") as f:
            pickle.dump(outcome, f)
        os.replace(tmp, self.result_path)
        with suppress(OSError):  # the caller is gone: nothing to tell
            os.write(self.write_fd, _OUTCOME_WRITTEN + b"\n")

    def take(self) -> tuple[str, Any] | None:
        try:
            with open(self.result_path, "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return None
        finally:
            self.close()

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with suppress(OSError):
                os.close(fd)
        with suppress(FileNotFoundError):
            os.unlink(self.result_path)


def run_passes(
    ctx: Any,
    passes: list[SelectedPass],
    notify: Notify,
    timed: Timed,
    finish: Finish,
    besides: dict[str, beside.Beside] | None = None,
) -> None:
    """Run `passes` on `ctx`, each in a forked child; `ctx.report` ends as the last process
    left it. `finish(ctx)` runs after the last pass, where the state is. A pass that raises
    ends the run with that exception, as in one process. `besides`: the passes that may
    run beside the others (inspector/beside.py)."""
    _reap_exited()
    channel = _Channel.open()
    line = _Line(channel, timed, finish, besides or {})
    try:
        finished_here = _hold_line(ctx, passes, 0, line, notify)
    except BaseException:
        channel.close()
        raise
    if finished_here:  # every child crashed: this process holds the latest state
        channel.close()
        finish(ctx)
        return
    outcome = channel.take()
    if outcome is None:
        raise RuntimeError("the isolated passes ended without leaving a report")
    kind, payload = outcome
    if kind == "raised":
        exc, text = payload
        exc.__cause__ = RemoteTraceback(text)
        raise exc
    from inspector.report import Report

    ctx.report = Report.from_json(payload)


@dataclass
class _Line:
    """What every process of the run shares: where results go, how passes are timed, and
    what the last process does once the passes are done."""

    channel: _Channel
    timed: Timed
    finish: Finish
    besides: dict[str, beside.Beside]  # the passes that may run beside the others
    started: dict[str, beside.Started] = field(default_factory=dict)  # those running


def _hold_line(
    ctx: Any, passes: list[SelectedPass], start: int, line: _Line, notify: Notify
) -> bool:
    """Fork a child for each pass from `start`. True when this process ran out of passes
    (the children crashed); False when a child finished the run."""
    kinds = [(p[0], p[3]) for p in passes]
    for i in range(start, len(passes)):
        name, run, percent, forked = passes[i]
        beside.start_ready(ctx, kinds, i, line.besides, line.started, line.channel.result_path)
        if name in line.started:  # it ran beside the passes since its inputs were done
            notify(name, percent)
            started = line.started.pop(name)
            beside.take_over(ctx, name, started, line.started, line.besides)
            with line.timed(name):
                status = beside.collect(ctx, started, line.besides[name])
            if started.taken_over:  # its time was the line's: timed as its own, in its place
                _add_seconds(ctx.report.meta.timings_s, name, started.seconds or 0.0)
            if status is not None:
                _record_failure(ctx, name, status, started.trace_path, started.seconds or 0.0)
            continue
        if not (forked(ctx) if callable(forked) else forked):  # no native crash: no fork
            notify(name, percent)
            with line.timed(name):
                run(ctx)
            continue
        trace_path = f"{line.channel.result_path}.{name}.trace"
        began = time.perf_counter()
        # Objects made so far are the child's too: out of the collector's sight, it never
        # touches (and so copies) their pages.
        gc.freeze()
        _return_free_memory()
        pid = os.fork()
        if pid == 0:
            _child(ctx, passes, i, line, trace_path)  # never returns
        status = _wait(pid, line.channel, notify)
        gc.unfreeze()
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            return False
        _record_failure(ctx, name, status, trace_path, time.perf_counter() - began)
    return True


def _add_seconds(timings: dict[str, float], stage: str, seconds: float) -> None:
    timings[stage] = round(timings.get(stage, 0.0) + seconds, 4)


def _return_free_memory() -> None:
    """Hand the heap's free pages back to the kernel before forking: this process then
    only waits, holding the state, while its child runs the pass. A pass's activations
    go back to glibc's heap when freed, not to the kernel, so every process of the chain
    kept the largest heap of its own pass: GPT-2 small at [4, 512] had four 7 GB
    processes waiting on each other, 20 of the machine's 23 GB used."""
    with suppress(OSError, AttributeError):
        _libc().malloc_trim(0)


# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def _keep_freed_memory() -> None:
    """glibc hands a freed tensor of 32 MB or more back to the kernel (each is mapped on
    its own), and the top of its heap too, so the next forward faults every page in
    again: a pass's process runs several forwards of one size (the gradients pass: the
    eager one, the per-node replay, the backward). Here every block comes from the heap
    and stays there; the process is the pass's own, and gives its heap back before it
    forks the next one (`_return_free_memory`) or when it exits. GPT-2 small at [4, 512]
    faulted 1.47 M pages (13.2 s) in its first forward and 0.66 M (9.1 s) in the second;
    kept, the second faulted 12 K pages (5.2 s). Not glibc (musl): nothing to set."""
    with suppress(OSError, AttributeError):
        libc = _libc()
        libc.mallopt(_M_MMAP_MAX, 0)
        libc.mallopt(_M_TRIM_THRESHOLD, -1)  # never trimmed on free


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _wait(pid: int, channel: _Channel, notify: Notify) -> int:
    """The child's wait status; the caller's process relays progress meanwhile."""
    if os.getpid() != channel.top_pid:
        return os.waitpid(pid, 0)[1]
    exited = _pidfd(pid)  # readable when the child exits: no polling delay
    try:
        while True:
            select.select([channel.read_fd] + ([exited] if exited is not None else []), [], [], 0.2)
            channel.drain(notify)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                channel.drain(notify)
                return status
            if channel.outcome_written:  # the run is over: its processes exit on their own
                _exiting.append(pid)
                return 0
    except BaseException:  # Ctrl-C, a timeout: the children die with us
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    finally:
        if exited is not None:
            os.close(exited)


def _reap_exited() -> None:
    """Reap the children of earlier runs that have exited since their outcome was taken."""
    for pid in list(_exiting):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else
            done = pid
        if done:
            _exiting.remove(pid)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Python < 3.9 or Linux < 5.3: poll instead
        return None


def _child(ctx: Any, passes: list[SelectedPass], i: int, line: _Line, trace_path: str) -> None:
    code, channel = 0, line.channel
    try:
        become_child()
        with open(trace_path, "w") as trace:
            faulthandler.enable(file=trace)  # where a native crash happened, for the report
            name, run, percent, _ = passes[i]
            channel.progress(name, percent)
            with line.timed(name):
                run(ctx)
            faulthandler.disable()
        os.unlink(trace_path)
        if _hold_line(ctx, passes, i + 1, line, channel.progress):
            line.finish(ctx)
            channel.put(("report", ctx.report.to_json()))
    except BaseException as exc:  # noqa: BLE001 - the caller re-raises it
        code = _put_exception(channel, exc, ctx)
        with suppress(OSError):  # no native crash to say where: not wanted
            os.unlink(trace_path)
    finally:
        os._exit(code)


def become_child() -> None:
    """Die with the parent; one intra-op thread (the parent's OpenMP pool is not ours);
    what the pass frees kept for its next allocations."""
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _keep_freed_memory()
    torch = sys.modules.get("torch")  # a parent without torch: nothing to set (or import)
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def _put_exception(channel: _Channel, exc: BaseException, ctx: Any) -> int:
    channel.put(raised_outcome(exc, ctx.loaded.user_files))
    return 0


def raised_outcome(exc: BaseException, user_files: list[str]) -> tuple[str, Any]:
    """("raised", (exception, its traceback's text)), as a pass's process sends it to
    the caller: the exception portable, and picklable (else a RuntimeError keeping its
    type name and message)."""
    text = "".join(traceback.format_exception(exc))
    exc = _portable(exc, user_files)
    try:
        pickle.dumps(exc)
    except Exception:  # noqa: BLE001 - unpicklable: keep its type name and message
        exc = RuntimeError(f"{type(exc).__name__}: {exc}")
    return ("raised", (exc, text))


def _portable(exc: BaseException, user_files: list[str]) -> BaseException:
    """`exc` as it must reach the caller without its traceback: a user's own exception
    becomes a UserCodeError showing their frames."""
    from inspector.errors import UserCodeError, UserError
    from inspector.tracebacks import format_user_traceback, user_frames, user_location

    if isinstance(exc, UserError):
        exc.user_traceback = exc.user_traceback or format_user_traceback(exc, user_files)
        return exc
    if isinstance(exc, Exception) and user_frames(exc, user_files):
        where = user_location(exc, user_files)
        return UserCodeError(
            f"your code raised {type(exc).__name__}: {exc}",
            location=where[0] if where else None,
            user_traceback=format_user_traceback(exc, user_files),
        )
    return exc


def signal_reason(status: int) -> str:
    """'killed by SIGSEGV (Segmentation fault)' for a wait status."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"killed by {name} ({signal.strsignal(number) or name})"
    return f"exited with status {os.WEXITSTATUS(status)}"


def _record_failure(ctx: Any, name: str, status: int, trace_path: str, seconds: float) -> None:
    reason = signal_reason(status)
    frames = _crash_frames(trace_path)
    where = " < ".join(f"{f} ({os.path.basename(p)}:{n})" for f, p, n in frames[:_TRACE_LINES])
    ctx.report.meta.failed_passes[name] = reason + (f" in {where}" if where else "")
    ctx.report.meta.timings_s[name] = round(seconds, 4)
    from inspector.tracebacks import is_user_file

    mine = [(p, n) for _, p, n in frames if is_user_file(p, ctx.loaded.user_files)]
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        blame = "SIGKILL comes from outside: most often the kernel, out of memory."
    elif mine:
        blame = (
            f"It happened under the model's code at {os.path.basename(mine[0][0])}:{mine[0][1]}."
        )
    else:
        blame = (
            "It is a native crash in torch or a library while the inspector analysed the "
            "model, not an error in the model: please report it."
        )
    ctx.report.meta.warnings.append(
        f"the {name} pass crashed its process ({reason}): its section is missing, the other "
        f"passes ran. {blame}"
    )


def _crash_frames(trace_path: str) -> list[tuple[str, str, str]]:
    """(function, file, line) of each frame faulthandler wrote, innermost first."""
    try:
        with open(trace_path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        os.unlink(trace_path)
    except OSError:
        return []
    frames = []
    for line in lines:  # '  File "/path/x.py", line 12 in forward'
        file_part, _, func = line.strip().partition(" in ")
        if file_part.startswith("File "):
            path, _, lineno = file_part.removeprefix("File ").partition(", line ")
            frames.append((func, path.strip('"'), lineno))
    return frames
