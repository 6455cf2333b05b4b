"""The measured inference forward, recorded on the load's input check.

The measured step (measure.py) opens with an inference forward (eval, no grad) whose
peak is the report's measured forward peak. The load's input check (inspector/fit.py)
is such a forward, on the same inputs: recorded by the same profiler, its allocations
give the live bytes' peak above its start, and the measured step adds what it holds
before its forward (its copy of the weights, the inputs) instead of running one more
(ResNet-18 at [8, 3, 224, 224]: 0.27 s of the step's 1.0 s).

Taken only where the check's forward is the one the step's would repeat: it left nothing
allocated but its outputs and the inspector's own copies (a cache made at the first call,
or weights made lazily, are in the step's copy of the model before its forward), and it
freed nothing it had not allocated (a cache replaced). Else `finish` gives None, and the
measured step runs its own forward, as before. The inspector's own copies made during
the forward (modes' eval() recording) are left out by address: they live on after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from inspector.context import Inputs
from inspector.health.outputs import flat_tensors
from inspector.memory.allocations import allocations_recorded, read_events, storage_of

__all__ = ["RecordedInference", "InferenceRecording"]


@dataclass(frozen=True)
class RecordedInference:
    inputs: Inputs  # what the forward ran on: it stands for those only
    peak_bytes: int  # the live bytes' peak above the forward's start


class InferenceRecording:
    """Around one forward (`recorded()`), then `finish` with its output."""

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        self._roots: Callable[[], list[Any]] | None = None

    @contextmanager
    def recorded(self) -> Iterator[None]:
        with allocations_recorded() as roots:
            yield
        self._roots = roots

    def finish(self, output: Any, copies: Iterable[torch.Tensor]) -> RecordedInference | None:
        """The recording, if the forward ran to its end and is one the measured step's
        would repeat; `copies`: tensors the inspector made during it and keeps."""
        if self._roots is None:
            return None
        events = read_events(self._roots()).events
        peak = forward_peak(events, _addresses(copies), _addresses(_tensors(output)))
        return None if peak is None else RecordedInference(self.inputs, peak)


def forward_peak(
    events: list[tuple[int, int, int]], ours: set[int], outputs: set[int]
) -> int | None:
    """The peak of the live bytes above the start, over `events` (time, +/- bytes,
    address) in time order, leaving out the last allocation at each of `ours`; None if a
    block the events did not allocate is freed, or one that lives on is not an output."""
    last = {ptr: i for i, (_, size, ptr) in enumerate(events) if size > 0 and ptr in ours}
    skipped = set(last.values())
    live: dict[int, int] = {}
    running = peak = 0
    for i, (_, size, ptr) in enumerate(events):
        if i in skipped or size == 0:
            continue
        if size > 0:
            live[ptr] = size
        elif live.pop(ptr, None) is None:
            return None  # freed what was there before: not a forward the step repeats
        running += size
        peak = max(peak, running)
    if not set(live) <= outputs:
        return None  # it kept something: a cache the step's copy of the model has already
    return peak


def _tensors(output: Any) -> list[torch.Tensor]:
    return [t for _, t in flat_tensors(output)]


def _addresses(tensors: Iterable[torch.Tensor]) -> set[int]:
    return {s.data_ptr() for t in tensors if (s := storage_of(t)) is not None}
