"""FSDP2 CPU offload (`fsdp:N,offload=true`): the GPU's peak and the host's share, from
the real tracked step.

`fully_shard(..., offload_policy=CPUOffloadPolicy(pin_memory=False))` runs for real on
the fake CPU world (pinning is the one step a CPU-only run cannot take; it changes where
the host bytes live, not how many). On a GPU that policy keeps on the host: each
parameter's padded shard (`_sharded_param_data`), its sharded gradient (the
reduce-scatter output's slice is copied device -> host, `new_sharded_grad.to("cpu")`,
and the device buffer is let go), hence the optimizer state and the whole optimizer
step. Here device and host are one CPU, where those `.to()` calls are no-ops, so the
split is made in the accounting, as the GPU would see it:
- host, not device: the shards' storages and the optimizer state (from the start), each
  gradient once FSDP hands it to its parameter (re-homed as the copy `.to("cpu")` makes
  on a GPU: unpadded, its own storage, so the reduce-scatter output dies when FSDP lets
  go of it), and everything the optimizer step allocates (it runs on the host: the
  device holds still then, so that phase adds no device peak);
- device, on top of the ordinary plan: at each all-gather, a unit's shards copied host
  -> device (`sharded_param_data.to(device)`), in the parameter's dtype, then cast to
  `param_dtype` if one is set; live until FSDP has copied them into its all-gather
  buffer, as on a GPU.
The host figure (`host_bytes`) is the shards, their gradients and the optimizer state
held by one rank; the optimizer step's own temporaries on the host are not in it.
Not modelled: transfer time and stream overlap (the pinned copies are asynchronous on a
GPU: this counts each copy live from its start to its last use).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from inspector.context import Inputs
from inspector.distributed.rankmemory import RankMemory
from inspector.distributed.rankstep import tracked_step
from inspector.distributed.shardtracker import ShardTracker, local
from inspector.memory.step import StepOptions
from inspector.memory.tracker import storage_key
from inspector.schema.parallel import PlanSpec

__all__ = [
    "offloadable_step",
    "OffloadTracker",
    "offloaded",
    "offload_policy",
    "host_keys",
    "copied_to_device",
]


def offloadable_step(
    model: nn.Module,
    inputs: Inputs,
    opts: StepOptions,
    optimizer: torch.optim.Optimizer | None,
    trainable: list[nn.Parameter],
    spec: PlanSpec,
) -> RankMemory:
    """The tracked step; under `offload=true` its peak is the device's and the host's
    bytes are apart, as this module's docstring says."""
    if not spec.options.get("offload"):
        return tracked_step(model, inputs, opts, optimizer, trainable)
    tracker = OffloadTracker(host_keys(model, optimizer), round_to=opts.round_to)
    with offloaded(tracker):
        out = tracked_step(model, inputs, opts, optimizer, trainable, tracker=tracker)
    out.host_bytes = out.param_bytes + out.grad_bytes + out.optimizer_bytes
    return out


def offload_policy() -> Any:
    from torch.distributed.fsdp import CPUOffloadPolicy

    return CPUOffloadPolicy(pin_memory=False)  # pinning needs an accelerator


def host_keys(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> set[int]:
    """Storages that live on the host from the start: shards and optimizer state."""
    keys = {storage_key(local(p)) for p in model.parameters()}
    for state in optimizer.state.values() if optimizer else []:
        keys.update(storage_key(local(v)) for v in state.values() if isinstance(v, torch.Tensor))
    return keys


class OffloadTracker(ShardTracker):
    """Counts device bytes in `live` (the peak is the device's) and host bytes apart."""

    def __init__(self, host: set[int], round_to: int = 1) -> None:
        super().__init__(round_to=round_to)
        self.host = host  # storage keys registered on the host
        self.host_live = 0
        self._hosting = 0  # >0: storages made now are host memory

    def add(self, t: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        key = storage_key(local(t))
        new = key not in self.entries  # an in-place op's output is not a new storage
        super().add(t, *args, **kwargs)
        if key in self.host or new and (self._hosting or self.phase == "optimizer"):
            self._to_host(key)

    def _to_host(self, key: int) -> None:
        entry = self.entries.get(key)
        if entry is not None and entry.kind != "host":
            self.live -= entry.nbytes
            self.host_live += entry.nbytes
            entry.kind = "host"

    @contextmanager
    def on_host(self) -> Iterator[None]:
        self._hosting += 1
        try:
            yield
        finally:
            self._hosting -= 1

    def _freed_cb(self, key: int):  # noqa: ANN202 - a weakref callback
        def freed(_ref: object) -> None:
            entry = self.entries.pop(key, None)
            if entry is not None and entry.kind == "host":
                self.host_live -= entry.nbytes
            elif entry is not None:
                self.live -= entry.nbytes

        return freed

    def _note_peak(self, label: str | None, scratch: int = 0) -> None:
        if self.phase != "optimizer":  # the step runs on the host: the device holds still
            super()._note_peak(label, scratch)


@contextmanager
def offloaded(tracker: OffloadTracker) -> Iterator[None]:
    """While the step runs: each all-gather copies the shards to the device (a new
    storage, as `.to(device)` makes on a GPU), each reduced gradient moves to the host."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    cls = _fsdp_param.FSDPParam
    gather_inputs = cls.all_gather_inputs
    reduce = _fsdp_param_group.foreach_reduce

    def reduced(fsdp_params: list[Any], *args: Any, **kwargs: Any) -> Any:
        out = reduce(fsdp_params, *args, **kwargs)
        with tracker.on_host():
            for fp in fsdp_params:
                grad = fp.sharded_param.grad
                if fp.offload_to_cpu and grad is not None:
                    fp.sharded_param.grad = fp.to_sharded_dtensor(local(grad).clone())
        return out

    cls.all_gather_inputs = property(copied_to_device(gather_inputs.fget))
    _fsdp_param_group.foreach_reduce = reduced
    try:
        yield
    finally:
        cls.all_gather_inputs = gather_inputs
        _fsdp_param_group.foreach_reduce = reduce


def copied_to_device(gather_inputs: Callable[[Any], list[torch.Tensor]]) -> Callable:
    """FSDPParam.all_gather_inputs with the shard copied host -> device first: torch's
    `.to(device)` of the shard is a no-op here, so it is handed a copy to move."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState

    def copied_in(self: Any) -> list[torch.Tensor]:
        if not self.offload_to_cpu or self.sharded_state != ShardedState.SHARDED:
            return gather_inputs(self)
        on_host = self._sharded_param_data
        self._sharded_param_data = on_host.clone()  # a new storage: the device's copy
        try:
            return gather_inputs(self)
        finally:
            self._sharded_param_data = on_host

    return copied_in
