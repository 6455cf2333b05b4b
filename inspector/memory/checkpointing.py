"""Advice that holds: the advised activation checkpointing, run on fake tensors.

`checkpointed(model, paths)` makes each block at `paths` run under
`torch.utils.checkpoint.checkpoint` (non-reentrant), as a user would wrap it; the memory
pass re-runs its training step that way and the advice quotes the saving measured, not
the one predicted from which storages the block's ops saved. Blocks of one type with the
same predicted saving (the layers of a transformer) are checked once, on the first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

from inspector.memory.analysis import Analysis, fb_peak, rerun
from inspector.memory.step import TrainResult

__all__ = ["checkpointed", "CheckpointRun", "forwards_wrapped", "run_checkpointed"]


@contextmanager
def forwards_wrapped(
    model: nn.Module, paths: list[str], wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> Iterator[None]:
    """Within the block, the modules at `paths` run `wrap(their forward)`."""
    wrapped = []
    for path in paths:
        module = model.get_submodule(path)
        module.forward = wrap(module.forward)  # an instance attribute: undone below
        wrapped.append(module)
    try:
        yield
    finally:
        for module in wrapped:
            del module.forward


def checkpointed(model: nn.Module, paths: list[str]) -> AbstractContextManager[None]:
    """Within the block, the modules at `paths` recompute their activations in backward."""
    return forwards_wrapped(model, paths, _checkpointing)


def _checkpointing(forward: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        # RNG state is not replayed: values do not matter to memory, and fake tensors
        # have no generator state to restore.
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)

    return run


@dataclass(frozen=True)
class CheckpointRun:
    saved_bytes: int  # what the training step saves with the blocks checkpointed
    fb_peak_bytes: int  # its forward/backward peak
    peak_bytes: int  # its training-step peak

    def saving(self, base: TrainResult) -> int:
        return base.saved_bytes - self.saved_bytes


def run_checkpointed(a: Analysis, paths: list[str]) -> CheckpointRun:
    """The memory pass's training step again, with the blocks at `paths` checkpointed."""
    with checkpointed(a.model, paths):
        train = rerun(a, a.inputs)
    optimizer_peak = a.train.phase_peaks.get("optimizer", 0)
    return CheckpointRun(train.saved_bytes, fb_peak(train), max(fb_peak(train), optimizer_peak))
