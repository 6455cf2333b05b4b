"""One training step as one rank, tracked: the memory pass's step (inspector.memory.step)
with a rank's view of memory. Parameters, gradients and optimizer state count their
local shards (DTensor `_local_tensor`); FSDP2's gathered parameters are counted while
their storages are allocated and are not activations, though the ops save them.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from inspector.context import Inputs
from inspector.distributed.rankmemory import RankMemory
from inspector.distributed.shardtracker import (
    ShardSavedTracker,
    ShardTracker,
    local,
    storage_resizes,
)
from inspector.memory.labels import module_labels, tag_graph
from inspector.memory.loss import compute_loss
from inspector.memory.optimizer import state_bytes_of
from inspector.memory.step import StepOptions, unique_tensors
from inspector.memory.tracker import storage_key
from inspector.memory.warmup import without_inplace_arithmetic

__all__ = ["tracked_step"]


def _autocast(opts: StepOptions) -> Any:
    if opts.autocast is None:
        return nullcontext()
    return torch.autocast(device_type=opts.device, dtype=opts.autocast)


def _locals(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return unique_tensors(local(t) for t in tensors)


def tracked_step(
    model: nn.Module,
    inputs: Inputs,
    opts: StepOptions,
    optimizer: torch.optim.Optimizer | None,
    trainable: list[nn.Parameter],
    resident_bytes: int = 0,
    state_of: torch.optim.Optimizer | None = None,
    tracker: ShardTracker | None = None,
) -> RankMemory:
    """One tracked step as a rank; `resident_bytes` more are held throughout (DDP's
    buckets), `state_of` holds the optimizer state (ZeRO's inner optimizer), `tracker`
    counts it (CPU offload's counts the device apart from the host)."""
    state_of = state_of or optimizer
    tracker = tracker or ShardTracker(round_to=opts.round_to)
    tracker.live += resident_bytes
    params, buffers = _locals(list(model.parameters())), _locals(list(model.buffers()))
    tracker.add_all(params + buffers, "static", "(parameters)")
    tracker.add_all(inputs.tensors(), "input", "(input)")
    state = [v for s in (state_of.state.values() if state_of else []) for v in s.values()]
    tracker.add_all(_locals([v for v in state if isinstance(v, torch.Tensor)]), "static")
    # gathered parameters are saved by the ops that use them, but FSDP frees them after
    # forward: they are not activations (tracker.unsharded grows as FSDP gathers)
    exclude = tracker.unsharded
    exclude.update(storage_key(t) for t in params + buffers)
    with tracker, storage_resizes(tracker), module_labels(model, tracker, tag=True):
        with ShardSavedTracker(tracker, exclude) as saved, _autocast(opts):
            tracker.label = None
            output = inputs.call(model)
            tracker.label = "(loss)"
            loss = compute_loss(opts.loss_fn, output, inputs)
            tag_graph(loss, "(loss)")
            del output
        tracker.set_phase("backward")
        loss.backward()
        grads = _locals([p.grad for p in trainable if p.grad is not None])
        tracker.set_phase("optimizer")
        tracker.label = "(optimizer.step)"
        if optimizer is not None:
            with without_inplace_arithmetic(trainable):
                optimizer.step()
        for p in trainable:
            p.grad = None
    return RankMemory(
        strategy="",
        world_size=0,
        rank=0,
        peak_bytes=tracker.peak,
        peak_phase=tracker.peak_phase,
        peak_label=tracker.peak_label,
        param_bytes=sum(t.untyped_storage().nbytes() for t in params),
        grad_bytes=sum(t.untyped_storage().nbytes() for t in grads),
        optimizer_bytes=state_bytes_of(state_of, view=local),
        input_bytes=tracker.bytes_where("input"),
        saved_activation_bytes=saved.total_bytes,
        comm_bytes=0,
        phase_peaks=dict(tracker.phase_peaks),
        phase_labels=dict(tracker.phase_labels),
        kind_peaks=dict(tracker.kind_peaks),
    )
