"""Passes run beside the others: forked as soon as the passes whose results they read are
done, put in the report where they stand in the order (inspector/isolation.py calls this).

A pass that can run beside is two functions (`Beside`, registered in inspector/passes):
`compute(ctx)` works its result out from what the passes before `after` left, without
touching the report; `apply(ctx, result)` puts it in the report and results, in order.
Run in order, the pass is `apply(ctx, compute(ctx))`: the report is the same either way.

Three passes start once the memory pass is done (its estimate sizes their memory): the
measured real step (passes/measure.py), which needs nothing else, computes while the
gradients and modes passes compute (GPT-2 small at [4, 512]: two real forwards at once
took 7.9 s each against 7.0 s alone on this 2-core machine; two ResNet-18 steps at once
took twice as long each, no loss either); Dynamo's check (passes/dynamo.py), which reads
only the memory pass's timings, is mostly Python; the export checks (passes/export.py)
go beside only where real runs are the dear ones.

Running beside costs memory at once that in order is taken in turn, so a pass starts
beside only where the memory estimate leaves room for it: its own need, the need of
those already running, and a training step's peak for the passes this process goes on
with, within the memory the machine has available and the job's budget, where the
service sets one (MGI_JOB_MEMORY_BYTES). Else it runs in its place, in order.

As with every isolated pass, the work runs in a process of its own under a supervisor:
a native crash costs only its section, said as the isolated passes say it; an exception
it raises ends the run, as in one process. It runs only where forking is how the passes
run (isolation), and where a second core can take it.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import pickle
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Beside", "Started", "start_ready", "collect", "MEMORY_ENV"]

MEMORY_ENV = "MGI_JOB_MEMORY_BYTES"  # the job's memory budget, set by the service


@dataclass(frozen=True)
class Beside:
    """How a pass runs beside the others."""

    after: str  # the last pass whose results `compute` reads
    compute: Callable[[Any], Any]  # ctx -> its result (picklable); the report untouched
    apply: Callable[[Any, Any], None]  # (ctx, result): into the report, in order
    needs: Callable[[Any], int | None]  # ctx -> bytes it takes at most; None: unknown


@dataclass
class Started:
    """A pass running beside the others: where its result arrives."""

    read_fd: int
    trace_path: str
    began: float
    needs: int  # the bytes it was given room for


def start_ready(
    ctx: Any,
    passes: list[tuple[str, bool]],
    i: int,
    besides: dict[str, Beside],
    started: dict[str, Started],
    prefix: str,
) -> None:
    """Start each pass of `passes[i:]` ((name, runs the model)) that can run beside the
    others, whose last input, `passes[i - 1]`, is now done, and that has room; `started`
    records it (a forked process's copy too). A pass that does not run the model (a
    value pass on fake tensors says it was skipped) is not worth a process."""
    if i == 0 or not _spare_core():
        return
    after, ahead = passes[i - 1][0], {name for name, runs in passes[i:] if runs}
    for name, beside in besides.items():
        if beside.after == after and name in ahead and name not in started:
            needs = beside.needs(ctx)
            if needs is not None and _room(ctx, needs, started):
                started[name] = _start(ctx, beside.compute, f"{prefix}.{name}", needs)


def collect(ctx: Any, started: Started, beside: Beside) -> int | None:
    """Wait for the pass's result and apply it; raise what it raised. Returns None, or
    the wait status of a pass process that crashed."""
    with os.fdopen(started.read_fd, "rb") as f:
        data = f.read()
    if not data:  # the supervisor itself was killed (out of memory): so was the pass
        return signal.SIGKILL
    kind, payload = pickle.loads(data)
    if kind == "crashed":
        return payload
    if kind == "raised":
        from inspector.isolation import RemoteTraceback

        exc, text = payload
        exc.__cause__ = RemoteTraceback(text)
        raise exc
    beside.apply(ctx, payload)
    return None


def _room(ctx: Any, needs: int, started: dict[str, Started]) -> bool:
    """Whether `needs` more bytes fit beside those already running and a training
    step's peak for this process's own passes (the memory estimate's)."""
    step = ctx.report.memory.train_peak_bytes
    if step is None:  # no estimate: nothing to go on
        return False
    wanted = step + sum(s.needs for s in started.values()) + needs
    if wanted > _available_bytes():
        return False
    budget = os.environ.get(MEMORY_ENV, "")
    return not budget.isdigit() or _resident_bytes() + wanted <= int(budget)


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0  # unknown: no room


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 1 << 62  # unknown: no room


def _spare_core() -> bool:
    from inspector.forkmap import _workers

    return _workers(2) >= 2


def _start(ctx: Any, compute: Callable[[Any], Any], prefix: str, needs: int) -> Started:
    read_fd, write_fd = os.pipe()
    trace_path = f"{prefix}.trace"
    gc.freeze()  # as isolation does: the child never touches (so copies) these pages
    pid = os.fork()
    if pid == 0:  # the supervisor: it runs the pass in a child of its own
        os.close(read_fd)
        try:
            from inspector.isolation import become_child

            become_child()
            data = pickle.dumps(_supervise(ctx, compute, f"{prefix}.outcome", trace_path))
            with os.fdopen(write_fd, "wb") as out:
                out.write(data)
        finally:
            os._exit(0)
    gc.unfreeze()
    os.close(write_fd)
    return Started(read_fd, trace_path, time.perf_counter(), needs)


def _supervise(ctx: Any, compute: Any, outcome_path: str, trace_path: str) -> tuple:
    pid = os.fork()
    if pid == 0:
        _run_pass(ctx, compute, outcome_path, trace_path)  # never returns
    _, status = os.waitpid(pid, 0)
    try:
        with open(outcome_path, "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return ("crashed", status)
    finally:
        if os.path.exists(outcome_path):
            os.unlink(outcome_path)


def _run_pass(ctx: Any, compute: Any, outcome_path: str, trace_path: str) -> None:
    from inspector.isolation import become_child, raised_outcome

    try:
        try:
            become_child()
            with open(trace_path, "w") as trace:
                faulthandler.enable(file=trace)  # where a native crash happened, for the report
                result = compute(ctx)
                faulthandler.disable()
            os.unlink(trace_path)
            data = pickle.dumps(("done", result))
        except BaseException as exc:  # noqa: BLE001 - the collector raises it
            data = pickle.dumps(raised_outcome(exc, ctx.loaded.user_files))
        tmp = f"{outcome_path}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, outcome_path)
    finally:
        os._exit(0)
