"""FSDP2 on fake tensors: the real `fully_shard` code, one tracked training step, as one
rank of a fake world of any size.

Wrapping follows torchtitan: `fully_shard` on each repeated block (the model's blocks, as
the checkpointing advice finds them) and then on the root; `checkpoint=true` also runs
each block under non-reentrant activation checkpointing (`recompute`: only the blocks
named, as a fit plan checkpoints some). The step is the memory
pass's step (inspector.memory.step): optimizer state resident, forward, loss, backward,
optimizer.step(), zero_grad(set_to_none=True). Everything FSDP2 allocates is an aten op
the tracker sees (all-gather outputs, the reduce-scatter input and output, the copy-in
buffers), except its storage resizes, which `storage_resizes` reports. `offload=true`
adds FSDP2's CPUOffloadPolicy, whose device/host split is inspector.distributed.offload's.

Heaviest rank: FSDP2 shards each parameter on dim 0 in chunks of ceil(dim0 / N) rows,
rank 0 first, and pads every rank's shard to the full chunk. Ranks whose chunks are all
full hold the same; a rank with a short or empty chunk holds less optimizer state but
more in the step (its gradient shard is copied out of the padded reduce-scatter output
instead of viewed: measured 14% more on `fsdp:3` of the test MLP). So one rank of each
distinct set of chunk sizes is run, and the heaviest is reported.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from inspector.context import Inputs
from inspector.distributed.inflight import IN_FLIGHT, collectives_in_flight
from inspector.distributed.offload import offload_policy, offloadable_step
from inspector.distributed.rankmemory import RankMemory
from inspector.distributed.world import fake_world
from inspector.forkmap import fork_map
from inspector.memory.advice import blocks
from inspector.memory.checkpointing import checkpointed
from inspector.memory.optimizer import make_optimizer
from inspector.memory.shadow import fake_shadow
from inspector.memory.step import StepOptions, unique_tensors, warm_up
from inspector.schema.parallel import PlanSpec

__all__ = [
    "shard_model",
    "fsdp_rank_memory",
    "fsdp_heaviest",
    "distinct_ranks",
    "shard_units",
    "PARAM_DTYPES",
]

PARAM_DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def shard_units(model: nn.Module) -> list[str]:
    """Paths of the modules `fully_shard` wraps before the root: the repeated blocks."""
    return [path for path, _ in blocks(model) if path]


def distinct_ranks(model: nn.Module, world_size: int) -> list[int]:
    """One rank per distinct tuple of local chunk sizes (rows of each parameter)."""
    rows = [p.shape[0] if p.dim() else 1 for p in unique_tensors(model.parameters())]
    # a rank's chunks change kind only at a parameter's boundary rank (its short chunk)
    # and the rank after it (the first empty one): only those need looking at
    candidates = {0, world_size - 1}
    for n in rows:
        edge = n // -(-n // world_size)
        candidates.update(r for r in (edge, edge + 1) if r < world_size)
    seen: dict[tuple[int, ...], int] = {}
    for rank in sorted(candidates):
        seen.setdefault(tuple(_chunk_rows(n, world_size, rank) for n in rows), rank)
    return sorted(seen.values())


def _chunk_rows(rows: int, world_size: int, rank: int) -> int:
    chunk = -(-rows // world_size)
    return max(0, min(chunk, rows - rank * chunk))


def fsdp_heaviest(
    model: nn.Module,
    inputs: Inputs,
    opts: StepOptions,
    spec: PlanSpec,
    recompute: list[str] | None = None,
) -> RankMemory:
    """The heaviest rank: each distinct kind of rank run, the largest peak kept."""
    ranks = distinct_ranks(model, spec.world_size)
    runs = fork_map(
        lambda r: fsdp_rank_memory(model, inputs, opts, spec, rank=r, recompute=recompute), ranks
    )
    return max(runs, key=lambda m: m.peak_bytes)


def fsdp_rank_memory(
    model: nn.Module,
    inputs: Inputs,
    opts: StepOptions,
    spec: PlanSpec,
    rank: int = 0,
    in_flight: int = IN_FLIGHT,
    recompute: list[str] | None = None,
) -> RankMemory:
    """Rank `rank`'s memory in one FSDP2 training step of `model` (a fake copy is run);
    `recompute`: the blocks checkpointed (None: every block under `checkpoint=true`)."""
    fake_mode = opts.fake_mode
    with fake_world(spec.world_size, rank) as mesh, fake_mode:
        shadow = fake_shadow(model, fake_mode)
        paths = shard_model(shadow, mesh, spec)
        shadow.train()
        trainable = [p for p in unique_tensors(shadow.parameters()) if p.requires_grad]
        optimizer = make_optimizer(opts.optimizer, trainable)
        warm_up(optimizer, trainable)
        if recompute is None:
            recompute = paths if spec.options.get("checkpoint") else []
        with collectives_in_flight(in_flight), checkpointed(shadow, recompute):
            out = offloadable_step(shadow, inputs, opts, optimizer, trainable, spec)
    out.strategy, out.world_size, out.rank = spec.text, spec.world_size, rank
    out.units = len(paths) + 1
    out.comm_bytes = _largest_unit_comm(shadow, paths, spec)
    return out


def shard_model(model: nn.Module, mesh: Any, spec: PlanSpec) -> list[str]:
    """`fully_shard` the blocks, then the root, as `spec` says; the blocks' paths."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtype = PARAM_DTYPES.get(str(spec.options.get("param_dtype", "")))
    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": bool(spec.options.get("reshard", True)),
    }
    if dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    if spec.options.get("offload"):
        kwargs["offload_policy"] = offload_policy()
    paths = shard_units(model)
    for path in paths:
        fully_shard(model.get_submodule(path), **kwargs)
    # the root gathers its own parameters (embeddings, head) and never reshards them
    # after forward: it is needed at once by the backward
    fully_shard(model, **{**kwargs, "reshard_after_forward": False})
    return paths


def _largest_unit_comm(model: nn.Module, paths: list[str], spec: PlanSpec) -> int:
    """The largest unit's all-gather output plus its reduce-scatter input, by hand:
    every parameter padded to N chunks of ceil(dim0 / N) rows, in the gathered dtype."""
    dtype = PARAM_DTYPES.get(str(spec.options.get("param_dtype", "")))
    owned: dict[str, list[torch.Tensor]] = {p: [] for p in ["", *paths]}
    for name, p in model.named_parameters():
        owner = max((u for u in owned if _inside(name, u)), key=len)
        owned[owner].append(p)
    n = spec.world_size

    def unit_bytes(ps: list[torch.Tensor]) -> int:
        total = 0
        for p in ps:
            rows = p.shape[0] if p.dim() else 1
            padded = -(-rows // n) * n * (p.numel() // max(rows, 1))
            total += padded * (dtype or p.dtype).itemsize
        return total

    return 2 * max((unit_bytes(ps) for ps in owned.values()), default=0)


def _inside(name: str, path: str) -> bool:
    return path == "" or name.startswith(path + ".")
