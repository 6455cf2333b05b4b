"""What autograd keeps for backward: saved tensors, deduplicated by storage.

`torch.autograd.graph.saved_tensors_hooks` calls `pack` for every tensor an op saves.
Several saves of one storage (a view, the same input saved by two ops) cost its bytes once.
Parameters and buffers are static memory, counted elsewhere, so they are left out; a
storage is attributed to the label (graph node or module) that produced it, which the
`LiveTracker` recorded when the storage first appeared. Each save also notes the modules
running as the op saved it (`savers`): what checkpointing a block can free at most
(inspector.memory.advice `checkpoint_bound`).
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import AbstractContextManager

import torch

from inspector.memory.tracker import LiveTracker, storage_bytes, storage_key

__all__ = ["SavedTracker"]


class SavedTracker:
    """Context manager: records saved storages while a forward runs."""

    def __init__(self, tracker: LiveTracker, exclude: set[int]) -> None:
        self.tracker = tracker
        self.exclude = exclude  # storage keys of parameters and buffers
        self.saved: dict[int, tuple[int, str | None]] = {}  # key -> (bytes, producer)
        # key -> the module stacks (outermost first) its saves happened under
        self.savers: dict[int, set[tuple[str, ...]]] = {}
        self._stacks: dict[tuple[str, ...], tuple[str, ...]] = {}  # one object per stack
        self._hooks: AbstractContextManager | None = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key in self.exclude:
            return t
        stack = tuple(self.tracker.modules)
        self.savers.setdefault(key, set()).add(self._stacks.setdefault(stack, stack))
        if key in self.saved:
            return t
        entry = self.tracker.entries.get(key)
        nbytes = entry.nbytes if entry else storage_bytes(t, self.tracker.round_to)
        self.saved[key] = (nbytes, entry.producer if entry else None)
        return t

    def __enter__(self) -> SavedTracker:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._hooks is not None
        self._hooks.__exit__(*exc)

    @property
    def total_bytes(self) -> int:
        return sum(nbytes for nbytes, _ in self.saved.values())

    def by_producer(self) -> dict[str | None, int]:
        out: dict[str | None, int] = defaultdict(int)
        for nbytes, producer in self.saved.values():
            out[producer] += nbytes
        return dict(out)


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
