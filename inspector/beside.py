"""Passes run beside the others: forked as soon as the passes whose results they read are
done, put in the report where they stand in the order (inspector/isolation.py calls this).

A pass that can run beside is two functions (`Beside`, registered in inspector/passes):
`compute(ctx)` works its result out from what the passes before `early` (or `after`)
left, without touching the report; `apply(ctx, result)` puts it in the report and
results, in order. Run in order, the pass is `apply(ctx, compute(ctx))`: the report is
the same either way.

Four passes start once the graph pass is done, sized by bounds from its nodes
(inspector/memory/rough.py), so they run beside the memory pass too, or, where the bounds
leave no room, once the memory pass is done (its estimate sizes them). The measured real
step (passes/measure.py) needs nothing else (where the gradients pass's forward and
backward stand for its own, it measures only the rest: its result is put together with
theirs in its place on the line); Dynamo's check (passes/dynamo.py) and the probe
(passes/probe.py) read only the load's and graph's timings, and the export checks
(passes/export.py) the capture.
Where real runs are the dear ones, they run in one lane per spare core (on 2 cores, one
lane beside the line's passes): real arithmetic contends for the memory (GPT-2 small at
[4, 512]: two real forwards at once took 7.9 s each against 7.0 s alone; two ResNet-18
steps at once took twice as long each). Where fake runs are the dear ones, the work on
both sides is Python (the memory pass's fake steps, Dynamo's and export's tracing), which
shares the cores without that loss: a lane per pass (`start_ready`), all three under way
while the memory pass runs (mobilenet_v3_small: 5.6 s to 4.8 s; the line had waited 1.5 s
for the export checks it ran after the memory pass, with the second core idle before).

Running beside costs memory at once that in order is taken in turn, so a pass starts
beside only where the memory estimate (or the bounds, before it) leaves room for it: the
need of its lane (the largest of the lane's passes), that of the lanes already running,
and a training step's peak for the passes this process goes on with, within the memory
the machine has available and the job's budget, where the service sets one
(MGI_JOB_MEMORY_BYTES). Else it runs in its place, in order.

A pass no lane has begun yet is the line's to take over: where the line reaches a pass
whose lane is still busy, it runs that pass, if its lane has not begun it, and the passes
queued behind in its own slot rather than wait (`take_over`). Whoever begins a pass
claims it first (a file made exclusively), so each runs once, in a lane or in the line.
A lane the kernel killed (out of memory) costs the pass it was running; the line runs
those it had not begun in their place.

As with every isolated pass, the work runs in a process of its own under its lane's
process: a native crash costs only its section, said as the isolated passes say it; an
exception it raises ends the run, as in one process. It runs only where forking is how
the passes run (isolation), and where a second core can take it.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import pickle
import select
import signal
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from inspector.realcost import fake_step_is_cheaper

__all__ = ["Beside", "Started", "start_ready", "take_over", "collect", "MEMORY_ENV"]

MEMORY_ENV = "MGI_JOB_MEMORY_BYTES"  # the job's memory budget, set by the service


@dataclass(frozen=True)
class Beside:
    """How a pass runs beside the others."""

    after: str  # where `early` left no room, it starts after this pass (its estimate sizes it)
    compute: Callable[[Any], Any]  # ctx -> its result (picklable); the report untouched
    apply: Callable[[Any, Any], None]  # (ctx, result): into the report, in order
    needs: Callable[[Any], int | None]  # ctx -> bytes it takes at most; None: unknown
    # it starts already after this earlier pass, the last whose results `compute` reads,
    # where bounds (inspector/memory/rough.py) leave room for it
    early: str | None = None


@dataclass
class Started:
    """A pass running beside the others: where its result arrives."""

    read_fd: int  # at end of file once the result is written (or its lane died)
    path: str  # where its files go: .claim, .result, .trace
    began: float  # when its lane started
    lane: int  # the process that runs it (one after another with the lane's others)
    needs: int  # the bytes its lane was given room for
    seconds: float | None = None  # how long it ran, once collected
    taken_over: bool = False  # the line ran it itself (`take_over`), not its lane

    @property
    def result_path(self) -> str:
        return f"{self.path}.result"

    @property
    def trace_path(self) -> str:
        return f"{self.path}.trace"


@dataclass
class _Queued:
    name: str
    compute: Callable[[Any], Any]
    needs: int


def start_ready(
    ctx: Any,
    passes: list[tuple[str, bool]],
    i: int,
    besides: dict[str, Beside],
    started: dict[str, Started],
    prefix: str,
) -> None:
    """Start each pass of `passes[i:]` ((name, runs the model)) that can run beside the
    others, that starts after `passes[i - 1]`, now done (its `early`, or its `after`),
    and that has room; `started` records it (a forked process's copy too). One that did
    not start early may start at its `after`. A pass that does not run the model (a value
    pass on fake tensors says it was skipped) is not worth a process.

    The passes go into lanes, each lane a process running its passes one after another,
    the dearest first (`besides` lists them so): once its own passes are done the line
    takes over those no lane has begun (`take_over`), the cheap ones, rather than wait
    alone for a dear one a lane began last (fcn_resnet50: its compile check, 1.2 s, began
    after the export, probe and measure in the one lane, and the line waited 0.8 s for
    it). Where real runs are the dear ones, one lane per core
    the line's own passes leave spare: real arithmetic contends for the memory, and more
    processes than cores slow the line's passes down (ResNet-18 at [8, 3, 224, 224] on 2
    cores: its gradients pass took 5.6 s beside three passes at once, 3.3 s beside one).
    Where fake runs are the dear ones, the work is Python, which shares the cores without
    that loss: a lane per pass (a 1,000-layer stack: the line waited 2.2 s for its
    measured step and compile check run in one lane, 0.8 s for the two side by side)."""
    spare = _spare_cores()
    if i == 0 or not spare:
        return
    done = passes[i - 1][0]
    ahead = [name for name, runs in passes[i:] if runs]  # in the order they are collected
    ready = [
        n
        for n in besides  # the dearest first
        if n in ahead and n not in started and done in (besides[n].early, besides[n].after)
    ]
    if not ready:
        return
    dear = fake_step_is_cheaper(ctx)  # real runs the dear ones
    lanes = spare if dear else max(spare, len(ready))
    queued: list[list[_Queued]] = [[] for _ in range(lanes)]
    for name in ready:
        needs = besides[name].needs(ctx)
        if needs is None:
            continue
        lane = queued[sum(map(len, queued)) % lanes]  # round the lanes, in collecting order
        extra = max(0, needs - max((q.needs for q in lane), default=0))
        planned = sum(max(q.needs for q in each) for each in queued if each)
        if _room(ctx, planned + extra, started):
            lane.append(_Queued(name, besides[name].compute, needs))
    first_lane = max((s.lane for s in started.values()), default=-1) + 1
    for n, lane in enumerate(each for each in queued if each):
        started.update(_start(ctx, lane, prefix, first_lane + n))


def take_over(
    ctx: Any,
    name: str,
    waiting: Started,
    started: dict[str, Started],
    besides: dict[str, Beside],
) -> None:
    """While the lane of `waiting` (the pass `name` the line has reached) is not done
    with it, run here, one after another, that pass and then the passes queued in lanes,
    each where no lane has begun it: the line would only wait (its lane may be busy with
    a dear pass begun first). Each runs in the slot the line keeps for its own passes (a
    training step's peak), so only one that needs no more. The progress goes on saying
    the waited pass, which runs meanwhile: stages are said in order, each once."""
    step = _step_peak(ctx)
    for each, queued in {name: waiting, **started}.items():
        if _done(waiting):
            return
        if queued.taken_over or step is None or (besides[each].needs(ctx) or 0) > step:
            continue
        if _claim(queued.path):  # no lane has begun it: it is the line's now
            queued.taken_over = True
            _run_here(ctx, besides[each].compute, queued.path)


def _run_here(ctx: Any, compute: Any, path: str) -> None:
    """Run a pass this process claimed, in a process of its own, as a lane would."""
    gc.freeze()  # as the lanes do: the pass's process never copies these pages
    try:
        _run_claimed(ctx, compute, path, [])
    finally:
        gc.unfreeze()


def _done(started: Started) -> bool:
    """Whether its lane is past it: the pipe's end of file, without waiting."""
    return bool(select.select([started.read_fd], [], [], 0)[0])


def _claim(path: str) -> bool:
    """Whether this process is the first to begin the pass at `path`."""
    try:
        os.close(os.open(f"{path}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True


def collect(ctx: Any, started: Started, beside: Beside) -> int | None:
    """Wait for the pass's result and apply it; raise what it raised. Returns None, or
    the wait status of a pass process that crashed."""
    with os.fdopen(started.read_fd, "rb") as f:
        # nothing comes: the end of file says the lane is past this pass. For one the line
        # took over, it found the claim and left the pass: only then may the claim go (a
        # lane slow to come to it began it again once the claim was gone)
        f.read()
    if not os.path.exists(started.result_path) and _claim(started.path):
        # its lane was killed (out of memory) before it began this pass: run it here, in
        # its place, as in order
        _run_here(ctx, beside.compute, started.path)
    try:
        with open(started.result_path, "rb") as f:
            kind, payload, started.seconds = pickle.load(f)
    except FileNotFoundError:  # the lane was killed (out of memory) while it ran the pass
        started.seconds = time.perf_counter() - started.began
        return signal.SIGKILL
    finally:
        for done_with in (started.result_path, f"{started.path}.claim"):
            with suppress(FileNotFoundError):
                os.unlink(done_with)
    if kind == "crashed":
        return payload
    if kind == "raised":
        from inspector.isolation import RemoteTraceback

        exc, text = payload
        exc.__cause__ = RemoteTraceback(text)
        raise exc
    beside.apply(ctx, payload)
    return None


def _room(ctx: Any, planned: int, started: dict[str, Started]) -> bool:
    """Whether lanes taking `planned` bytes fit beside the lanes already running and a
    training step's peak for this process's own passes (the memory estimate's)."""
    step = _step_peak(ctx)
    if step is None:  # no estimate nor bound: nothing to go on
        return False
    running = sum({s.lane: s.needs for s in started.values()}.values())
    wanted = step + running + planned
    if wanted > _available_bytes():
        return False
    budget = os.environ.get(MEMORY_ENV, "")
    return not budget.isdigit() or _resident_bytes() + wanted <= int(budget)


def _step_peak(ctx: Any) -> int | None:
    """A training step's peak: the room the line keeps for its own passes."""
    from inspector.memory.rough import step_bytes  # torch: not for the web process's import

    known = step_bytes(ctx)
    return known.train_peak if known is not None else None


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


def _spare_cores() -> int:
    """Cores beside the one the line's own passes run on."""
    from inspector.forkmap import _workers

    return _workers(8) - 1


def _start(ctx: Any, lane: list[_Queued], prefix: str, number: int) -> dict[str, Started]:
    """Fork the lane's process: it runs its passes one after another, each in a child of
    its own, and leaves each result in a file of its own, so a result not yet collected
    never holds the next pass up."""
    pipes = {q.name: os.pipe() for q in lane}
    paths = {q.name: f"{prefix}.{q.name}" for q in lane}
    needs = max(q.needs for q in lane)
    gc.freeze()  # as isolation does: the child never touches (so copies) these pages
    pid = os.fork()
    if pid == 0:  # the lane: it supervises its passes' processes
        try:
            from inspector.isolation import become_child

            become_child()
            for read_fd, _ in pipes.values():
                os.close(read_fd)
            _run_lane(ctx, lane, {n: w for n, (_, w) in pipes.items()}, paths)
        finally:
            os._exit(0)
    gc.unfreeze()
    began = time.perf_counter()
    started = {}
    for q in lane:
        read_fd, write_fd = pipes[q.name]
        os.close(write_fd)
        started[q.name] = Started(read_fd, paths[q.name], began, number, needs)
    return started


def _run_lane(
    ctx: Any, lane: list[_Queued], write_fds: dict[str, int], paths: dict[str, str]
) -> None:
    for q in lane:
        if not _claim(paths[q.name]):  # the line took it over while it waited
            os.close(write_fds.pop(q.name))
            continue
        outcome = _run_claimed(ctx, q.compute, paths[q.name], list(write_fds.values()))
        os.close(write_fds.pop(q.name))
        if outcome[0] == "raised":  # the line raises it when it gets there: no more needed
            break


def _run_claimed(ctx: Any, compute: Any, path: str, lane_fds: list[int]) -> tuple:
    """Run the pass in a process of its own; its outcome goes to `path`.result, with
    the seconds it took."""
    began = time.perf_counter()
    outcome = _supervise(ctx, compute, f"{path}.outcome", f"{path}.trace", lane_fds)
    tmp = f"{path}.result.tmp"
    with open(tmp, "wb") as f:
        pickle.dump((*outcome, time.perf_counter() - began), f)
    os.replace(tmp, f"{path}.result")
    return outcome


def _supervise(
    ctx: Any, compute: Any, outcome_path: str, trace_path: str, lane_fds: list[int]
) -> tuple:
    pid = os.fork()
    if pid == 0:
        for fd in lane_fds:  # a process the pass leaves running must not hold them open
            os.close(fd)
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
            with suppress(OSError):  # no native crash to say where: not wanted
                os.unlink(trace_path)
        tmp = f"{outcome_path}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, outcome_path)
    finally:
        os._exit(0)
