"""DistributedDataParallel: every rank runs the one-process step on its own batch, and
holds the gradient buckets on top.

The Reducer copies each gradient into a flat bucket, all-reduces the bucket in place and
copies it back (`gradient_as_bucket_view=False`, the default), so the buckets are one
more copy of every trainable parameter's gradient, allocated at construction and resident
for the whole step. Buckets fill in reverse parameter order: the first holds at most
`dist._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB), the others `bucket_cap_mb`. Every rank holds
the same, so rank 0 is as heavy as any.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from inspector.distributed.rankmemory import RankMemory
from inspector.memory.step import TrainResult, unique_tensors
from inspector.schema.parallel import DEFAULT_BUCKET_MB, PlanSpec

__all__ = ["bucket_sizes", "ddp_rank_memory"]

_MB = 1024 * 1024  # DDP's bucket_cap_mb is in MiB


def bucket_sizes(params: list[torch.Tensor], cap_mb: int = DEFAULT_BUCKET_MB) -> list[int]:
    """Bytes of each gradient bucket, one dtype per bucket, in the Reducer's order."""
    caps = [dist._DEFAULT_FIRST_BUCKET_BYTES, cap_mb * _MB]
    open_: dict[torch.dtype, int] = {}
    done: list[int] = []
    for p in reversed(unique_tensors(p for p in params if p.requires_grad)):
        nbytes = p.numel() * p.element_size()
        open_[p.dtype] = open_.get(p.dtype, 0) + nbytes
        if open_[p.dtype] >= caps[min(len(done), 1)]:
            done.append(open_.pop(p.dtype))
    return done + [b for b in open_.values() if b]


def ddp_rank_memory(train: TrainResult, params: list[torch.Tensor], spec: PlanSpec) -> RankMemory:
    """The measured one-process step `train` (the per-rank batch) plus the buckets."""
    buckets = bucket_sizes(params, int(spec.options.get("bucket_mb", DEFAULT_BUCKET_MB)))
    comm = sum(buckets)
    return RankMemory(
        strategy=spec.text,
        world_size=spec.world_size,
        rank=0,
        peak_bytes=train.peak_bytes + comm,
        peak_phase=train.peak_phase,
        peak_label=train.peak_label,
        param_bytes=train.param_bytes,
        grad_bytes=train.grad_bytes,
        optimizer_bytes=train.optimizer_bytes,
        input_bytes=train.input_bytes,
        saved_activation_bytes=train.saved_bytes,
        comm_bytes=comm,
        units=len(buckets),
    )
