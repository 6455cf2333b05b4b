"""ZeRO-1: DDP with torch's `ZeroRedundancyOptimizer`, which keeps on each rank the
optimizer state of its partition of the parameters only (after its step each rank
broadcasts the parameters it updated). Run on fake tensors in a fake world: DDP's buckets
are resident as under `ddp` (inspector.distributed.ddp), the step is the rank's own.

Heaviest rank: ZeRO partitions whole parameters greedily by size, so ranks hold
different state; the rank with the largest partition is run.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from inspector.context import Inputs
from inspector.distributed.ddp import bucket_sizes
from inspector.distributed.rankmemory import RankMemory
from inspector.distributed.rankstep import tracked_step
from inspector.distributed.world import fake_world
from inspector.memory.optimizer import make_optimizer
from inspector.memory.shadow import fake_shadow
from inspector.memory.step import StepOptions, unique_tensors, warm_up
from inspector.schema.parallel import DEFAULT_BUCKET_MB, PlanSpec

__all__ = ["zero1_rank_memory"]


def zero1_rank_memory(
    model: nn.Module, inputs: Inputs, opts: StepOptions, spec: PlanSpec
) -> RankMemory:
    if opts.optimizer in ("none", "sgd"):
        raise ValueError(f"ZeRO shards optimizer state and {opts.optimizer!r} keeps none")
    rank = _heaviest_rank(model, opts, spec)
    fake_mode = opts.fake_mode
    with fake_world(spec.world_size, rank), fake_mode:
        shadow = fake_shadow(model, fake_mode)
        shadow.train()
        trainable = [p for p in unique_tensors(shadow.parameters()) if p.requires_grad]
        optimizer = _zero(opts.optimizer, trainable)
        warm_up(optimizer, trainable)
        buckets = bucket_sizes(trainable, int(spec.options.get("bucket_mb", DEFAULT_BUCKET_MB)))
        out = tracked_step(
            shadow, inputs, opts, optimizer, trainable, sum(buckets), state_of=optimizer.optim
        )
    out.strategy, out.world_size, out.rank = spec.text, spec.world_size, rank
    out.comm_bytes, out.units = sum(buckets), len(buckets)
    return out


def _zero(name: str, params: list[nn.Parameter]) -> Any:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    inner = make_optimizer(name, params)  # the class and settings the option stands for
    settings = {k: inner.defaults[k] for k in ("lr", "momentum") if k in inner.defaults}
    return ZeroRedundancyOptimizer(params, optimizer_class=type(inner), **settings)


def _heaviest_rank(model: nn.Module, opts: StepOptions, spec: PlanSpec) -> int:
    """The rank whose partition holds the most parameter bytes (no step run)."""
    with fake_world(spec.world_size, 0), opts.fake_mode:
        params = [p for p in unique_tensors(fake_shadow(model, opts.fake_mode).parameters())]
        partitions = _zero(opts.optimizer, [p for p in params if p.requires_grad])
        sizes = [
            sum(p.numel() * p.element_size() for group in groups for p in group["params"])
            for groups in partitions._partition_parameters()
        ]
    return max(range(len(sizes)), key=lambda r: (sizes[r], -r))
