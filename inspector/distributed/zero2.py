"""ZeRO-2: every rank holds all the parameters; gradients and optimizer state are sharded.

`Zero2` is the strategy itself, a working optimizer wrapper over a process group (the
bench trains with it under torchrun): as soon as autograd has a parameter's gradient
(its post-accumulate-grad hook), the gradient is reduce-scattered, flat, in N chunks of
ceil(numel / N) elements (padded, as DeepSpeed partitions its flat groups), the rank
keeps its chunk and the full gradient is freed. The inner optimizer steps the rank's
chunks of the parameters (views into them), and an all-gather of the updated chunks
writes every parameter back whole. Gradients are reduced one parameter at a time (no
flat bucket: DeepSpeed's `reduce_bucket_size` would add its bucket on top).

`zero2_rank_memory` runs the same class on fake tensors in a fake world: the peak holds
the full gradient of the parameter being reduced, its padded copy and the reduce-scatter
output, besides the resident parameters, gradient shards and optimizer-state shards.
Heaviest rank: rank 0 (its chunks are full; later ranks' last chunks may be short).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from inspector.context import Inputs
from inspector.distributed.inflight import IN_FLIGHT
from inspector.distributed.rankmemory import RankMemory
from inspector.distributed.rankstep import tracked_step
from inspector.distributed.world import fake_world
from inspector.memory.optimizer import make_optimizer
from inspector.memory.shadow import fake_shadow
from inspector.memory.step import StepOptions, unique_tensors, warm_up
from inspector.schema.parallel import PlanSpec

__all__ = ["Zero2", "zero2_rank_memory"]


class Zero2:
    """ZeRO-2 over the default group around `inner` (an optimizer factory over tensors)."""

    def __init__(self, params: list[nn.Parameter], inner: Any, in_flight: int = 0) -> None:
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        # a fake group's collectives finish at once; a real one's worker threads hold the
        # last works' tensors a while (inspector.distributed.inflight): kept here instead
        self.held: deque = deque(maxlen=in_flight)
        self.params = [p for p in unique_tensors(params) if p.requires_grad]
        self.chunks = {p: -(-p.numel() // self.world) for p in self.params}
        self.shards = {p: self._shard_of(p) for p in self.params}
        self.grad_shards: dict[nn.Parameter, torch.Tensor] = {}
        self.optim = inner(list(self.shards.values()))
        self.grad_bytes = 0  # the gradient shards at the last step
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._reduce)

    @property
    def state(self) -> Any:
        return self.optim.state

    def _shard_of(self, p: nn.Parameter) -> torch.Tensor:
        chunk = self.chunks[p]
        start = min(self.rank * chunk, p.numel())
        return p.detach().view(-1)[start : min(start + chunk, p.numel())]

    def _reduce(self, p: nn.Parameter) -> None:
        """Reduce-scatter p's gradient now, keep this rank's chunk, free the rest."""
        chunk, flat = self.chunks[p], p.grad.view(-1)
        padded = (
            F.pad(flat, (0, chunk * self.world - flat.numel()))
            if flat.numel() % self.world
            else flat
        )
        out = torch.empty(chunk, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter_single(out, padded)
        self.held.append((padded, out))
        del padded, flat
        p.grad = None
        mine = out[: self.shards[p].numel()].div_(self.world)  # an average, as DDP's
        held = self.grad_shards.get(p)
        self.grad_shards[p] = mine if held is None else held.add_(mine)

    def step(self) -> None:
        """Step the shards, all-gather the parameters, drop the gradient shards."""
        self.grad_bytes = sum(g.untyped_storage().nbytes() for g in self.grad_shards.values())
        for p, shard in self.shards.items():
            shard.grad = self.grad_shards.get(p)
        self.optim.step()
        for p, shard in self.shards.items():
            shard.grad = None
            self._gather(p, shard)
        self.grad_shards.clear()

    def _gather(self, p: nn.Parameter, shard: torch.Tensor) -> None:
        chunk = self.chunks[p]
        mine = shard if shard.numel() == chunk else F.pad(shard, (0, chunk - shard.numel()))
        whole = torch.empty(chunk * self.world, dtype=p.dtype, device=p.device)
        dist.all_gather_single(whole, mine)
        self.held.append((whole, mine))
        p.detach().view(-1).copy_(whole[: p.numel()])

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.grad_shards.clear()


def zero2_rank_memory(
    model: nn.Module, inputs: Inputs, opts: StepOptions, spec: PlanSpec
) -> RankMemory:
    if opts.optimizer == "none":
        raise ValueError("ZeRO-2 shards gradients for an optimizer step, and there is none")
    with fake_world(spec.world_size, 0), opts.fake_mode:
        shadow = fake_shadow(model, opts.fake_mode)
        shadow.train()
        trainable = [p for p in unique_tensors(shadow.parameters()) if p.requires_grad]
        zero = Zero2(trainable, lambda ps: make_optimizer(opts.optimizer, ps), IN_FLIGHT)
        warm_up(zero.optim, list(zero.shards.values()))
        out = tracked_step(shadow, inputs, opts, zero, trainable, state_of=zero.optim)
    out.strategy, out.world_size, out.rank = spec.text, spec.world_size, 0
    out.grad_bytes = zero.grad_bytes
    # the largest parameter's reduce-scatter: its padded flat gradient and its chunk
    out.comm_bytes = max(
        ((spec.world_size + 1) * c * p.element_size() for p, c in zero.chunks.items()), default=0
    )
    out.units = len(trainable)
    return out
