"""The live-storage tracker for sharded training.

Three things the plain trackers cannot see:
- a DTensor (a sharded parameter, its gradient and optimizer state) is a wrapper whose
  own storage is not memory: what a rank holds is its `_local_tensor`;
- FSDP2 frees and re-allocates the unsharded parameters by resizing their storages
  (`storage.resize_(0)` / `resize_(n)`), which no aten op reports: its two helpers are
  wrapped while the step runs, and every resize updates the tracked bytes;
- autograd saves DTensors whole: what a rank keeps is their local tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from inspector.memory.saved import SavedTracker
from inspector.memory.tracker import LiveTracker, storage_key

__all__ = ["ShardTracker", "ShardSavedTracker", "local", "storage_resizes"]


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank-local tensor behind a DTensor (the tensor itself otherwise)."""
    return getattr(t, "_local_tensor", t)


class ShardTracker(LiveTracker):
    def __init__(self, round_to: int = 1) -> None:
        super().__init__(round_to=round_to)
        self.unsharded: set[int] = set()  # storage keys FSDP2 resizes: gathered params

    def add(self, t: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        super().add(local(t), *args, **kwargs)  # the local shard's storage

    def resized(self, t: torch.Tensor) -> None:
        """A storage FSDP2 just resized: count its new size (0 when freed)."""
        self.unsharded.add(storage_key(t))
        if self.producer_of(t) is None:
            self.add(t)
        else:
            self._maybe_resized(t, self.producer_of(t))
        self._note_peak(self.label)


class ShardSavedTracker(SavedTracker):
    """Saved tensors by their local shard: under tensor parallelism autograd saves
    DTensors (a sharded weight, a gathered input), whose wrapper has the global shape."""

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        super()._pack(local(t))
        return t


@contextmanager
def storage_resizes(tracker: ShardTracker) -> Iterator[None]:
    """Route FSDP2's alloc_storage / free_storage through `tracker.resized`."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    modules: list[Any] = [_fsdp_param, _fsdp_param_group]
    saved = [(m, name, getattr(m, name)) for m in modules for name in _HELPERS if hasattr(m, name)]

    def wrap(helper: Any) -> Any:
        def tracked(tensor: torch.Tensor) -> None:
            helper(tensor)
            tracker.resized(tensor)

        return tracked

    for module, name, helper in saved:
        setattr(module, name, wrap(helper))
    try:
        yield
    finally:
        for module, name, helper in saved:
            setattr(module, name, helper)


_HELPERS = ("alloc_storage", "free_storage")
