"""torch.profiler's allocation events on the CPU: each allocation and free with its size
and address, and the `record_function` windows the inspector opened around them. The
ground truth of the measured step (measure.py) and of the load's inference forward
(inference.py) is read from them."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from inspector.nativenoise import native_noise_filtered

__all__ = [
    "Recorded", "allocations_recorded", "read_events", "storage_of", "WINDOW_PREFIX", "ours",
    "leaving_ours_out", "ours_left_out", "lifetimes",
]  # fmt: skip

WINDOW_PREFIX = "inspector."  # `record_function` names of the windows read back
OURS = WINDOW_PREFIX + "ours"  # the inspector's own work inside a recorded step

_leaving_out = False  # a recording leaves the inspector's own allocations out (`ours`)


@dataclass
class Recorded:
    """What one recording saw: (time_ns, +/- bytes, address) in time order, and each
    window's (start_ns, end_ns) by its name without the prefix."""

    events: list[tuple[int, int, int]] = field(default_factory=list)
    windows: dict[str, tuple[int, int]] = field(default_factory=dict)
    ours: list[tuple[int, int]] = field(default_factory=list)  # `ours` windows, in order


def read_events(roots: list[Any]) -> Recorded:
    """The allocations and our windows in a recording's event tree."""
    from torch._C._profiler import _EventType

    recorded = Recorded()
    stack = list(roots)
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            recorded.events.append((event.start_time_ns, fields.alloc_size, fields.ptr))
        elif event.name == OURS:
            recorded.ours.append((event.start_time_ns, event.end_time_ns))
        elif event.name.startswith(WINDOW_PREFIX):
            name = event.name[len(WINDOW_PREFIX) :]
            recorded.windows[name] = (event.start_time_ns, event.end_time_ns)
    recorded.events.sort()
    recorded.ours.sort()
    return recorded


def lifetimes(
    events: list[tuple[int, int, int]], left_out: Sequence[tuple[int, int]] = ()
) -> list[tuple[int, int]]:
    """(time_ns, +/- bytes): the allocations, and the frees of what this recording saw
    allocated. The profiler also reports freeing a block that an earlier recording in the
    process allocated (a tensor kept from it, collected by the garbage collector during
    our step): counted, it would lower the step's live bytes by memory the step never had.
    What was allocated inside a `left_out` window (start_ns, end_ns, in order: `ours`) is
    left out, and its free with it."""
    starts = [start for start, _ in left_out]

    def inside(t: int) -> bool:
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and left_out[i][0] <= t <= left_out[i][1]

    live: set[int] = set()
    ours: set[int] = set()
    kept = []
    for t, size, ptr in events:
        if size > 0:
            if starts and inside(t):
                ours.add(ptr)
                continue
            live.add(ptr)
        elif ptr in live:
            live.discard(ptr)
        else:  # ours, or what the recording never saw allocated
            ours.discard(ptr)
            continue
        kept.append((t, size))
    return kept


def ours() -> Any:
    """A window around the inspector's own work (statistics, copies, comparisons) inside a
    step whose allocations are recorded (`leaving_ours_out`): what it allocates, and frees,
    is left out of the step's. Nothing while no such recording runs."""
    return _our_window() if _leaving_out else nullcontext()


@contextmanager
def _our_window() -> Iterator[None]:
    # unseen by a function mode watching the user's ops (the gradients pass's recorders)
    with torch._C.DisableTorchFunction(), torch.profiler.record_function(OURS):
        yield


def leaving_ours_out() -> bool:
    """Whether a recording now leaves the inspector's own work out (`ours`)."""
    return _leaving_out


@contextmanager
def ours_left_out() -> Iterator[None]:
    """Within the block, `ours` opens its windows."""
    global _leaving_out
    before, _leaving_out = _leaving_out, True
    try:
        yield
    finally:
        _leaving_out = before


def storage_of(t: torch.Tensor) -> torch.UntypedStorage | None:
    """The storage whose address the events name; None for a tensor without one storage
    (sparse, a wrapper subclass)."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


@contextmanager
def allocations_recorded() -> Iterator[Callable[[], list[Any]]]:
    """torch.profiler's CPU recording with memory events, keeping the allocations and our
    `record_function` windows (the user scope) only: not an event per op, which on a
    1,000-layer model made stopping the profiler and reading its events take seconds
    longer than the step itself. Where torch's private entry points differ, the public
    profiler records everything, as before. Yields what returns the event tree's roots,
    once the recording has stopped.

    Kineto prints a line straight to fd 2 as it starts and stops: those two moments only
    are filtered, so what the block writes (a native crash's report) reaches fd 2 as it
    happens."""
    config = _user_scope_config()
    if config is None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        prof = torch.profiler.profile(activities=activities, profile_memory=True)
        with native_noise_filtered():
            prof.start()
        try:
            yield lambda: list(prof.profiler.kineto_results.experimental_event_tree())
        finally:
            with native_noise_filtered():
                prof.stop()
        return
    from torch._C._profiler import ProfilerActivity, RecordScope
    from torch.autograd import _disable_profiler, _enable_profiler, _prepare_profiler

    activities = {ProfilerActivity.CPU}
    with native_noise_filtered():
        _prepare_profiler(config, activities)
        _enable_profiler(config, activities, {RecordScope.USER_SCOPE})
    result = None
    try:
        yield lambda: list(result.experimental_event_tree())
    finally:
        with native_noise_filtered():
            result = _disable_profiler()


def _user_scope_config() -> Any:
    """The profiler's config for memory events, or None where this torch spells its
    private entry points otherwise."""
    try:
        from torch._C._profiler import (
            ProfilerConfig,
            ProfilerState,
            RecordScope,  # noqa: F401 - what the recording asks for
            _ExperimentalConfig,
        )
        from torch.autograd import (  # noqa: F401 - what the recording calls
            _disable_profiler,
            _enable_profiler,
            _prepare_profiler,
        )

        args = (ProfilerState.KINETO, False, True, False, False, False, _ExperimentalConfig())
        try:
            return ProfilerConfig(*args, "")  # torch >= 2.6: a trace id
        except TypeError:
            return ProfilerConfig(*args)
    except (ImportError, AttributeError, TypeError):
        return None
