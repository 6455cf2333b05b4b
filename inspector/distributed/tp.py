"""Tensor parallelism on fake tensors: torch's own `parallelize_module` with the derived
plan (inspector.distributed.tpplan), one tracked training step, as one rank of a fake
world; and the 2-D plan, TP inside groups of `tp` ranks and FSDP2 across the groups, as
torchtitan builds it (`parallelize_module` on the mesh's "tp" dim, then `fully_shard`
per block + root on its "dp" dim).

DTensor's redistributions (the all-gathers of sequence-parallel inputs, the all-reduces
and reduce-scatters of row-parallel outputs, their backward twins) run as functional
collectives the tracker sees, so their buffers are in the peak. The largest single
collective output is reported as the communication buffer.

Heaviest rank: the plan refuses heads that do not divide, so attention shards are even;
other uneven dims split like `torch.chunk` (rank 0 gets the largest piece, no padding),
so rank 0 (and, in 2-D, the FSDP side's heaviest kind of rank) is the heaviest.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from inspector.context import Inputs
from inspector.distributed.fsdp import distinct_ranks, shard_model
from inspector.distributed.inflight import IN_FLIGHT, collectives_in_flight
from inspector.distributed.offload import offloadable_step
from inspector.distributed.rankmemory import RankMemory
from inspector.distributed.shardtracker import local
from inspector.distributed.tpplan import tensor_parallel_plan
from inspector.distributed.world import fake_world
from inspector.forkmap import fork_map
from inspector.memory.checkpointing import checkpointed
from inspector.memory.optimizer import make_optimizer
from inspector.memory.shadow import fake_shadow
from inspector.memory.step import StepOptions, unique_tensors, warm_up
from inspector.schema.parallel import PlanSpec

__all__ = ["tp_rank_memory", "fsdp_tp_heaviest", "tp_kinds", "fake_mesh_2d"]


@contextmanager
def fake_mesh_2d(dp: int, tp: int, rank: int = 0) -> Iterator[Any]:
    """A ("dp", "tp") CPU mesh over a fake group of dp * tp ranks; TP groups are
    consecutive ranks (rank = dp_index * tp + tp_index), as torchtitan lays them out."""
    with fake_world(dp * tp, rank, (dp, tp), ("dp", "tp")) as mesh:
        yield mesh


def tp_rank_memory(
    model: nn.Module, inputs: Inputs, opts: StepOptions, spec: PlanSpec, rank: int = 0
) -> RankMemory:
    """Rank `rank`'s memory in one training step under `tp:N` (or the 2-D `fsdp:M+tp:N`)."""
    plan = tensor_parallel_plan(model, spec.tp_size, bool(spec.options.get("sp")))
    fake_mode = opts.fake_mode
    with fake_mesh_2d(spec.dp_size, spec.tp_size, rank) as mesh, fake_mode:
        from torch.distributed.tensor.parallel import parallelize_module

        shadow = fake_shadow(model, fake_mode)
        parallelize_module(shadow, mesh["tp"], plan.styles)
        paths: list[str] = []
        if spec.strategy == "fsdp+tp":
            paths = shard_model(shadow, mesh["dp"], spec)
        recompute = _recomputed(shadow, paths, spec)
        shadow.train()
        trainable = [p for p in unique_tensors(shadow.parameters()) if p.requires_grad]
        optimizer = make_optimizer(opts.optimizer, trainable)
        warm_up(optimizer, trainable)
        depth = IN_FLIGHT if paths else 0
        with collectives_in_flight(depth), checkpointed(shadow, recompute), _largest() as comm:
            out = offloadable_step(shadow, inputs, opts, optimizer, trainable, spec)
    out.strategy, out.world_size, out.rank = spec.text, spec.world_size, rank
    out.comm_bytes = comm.bytes
    out.units = len(plan.sharded)
    if plan.replicated:
        out.notes.append("not split by TP (replicated on every TP rank): " + ", ".join(
            plan.replicated[:6]) + (" ..." if len(plan.replicated) > 6 else ""))  # fmt: skip
    return out


def fsdp_tp_heaviest(
    model: nn.Module, inputs: Inputs, opts: StepOptions, spec: PlanSpec
) -> RankMemory:
    """The heaviest rank of a TP or 2-D plan: under 2-D, one rank per distinct kind of
    FSDP shard (FSDP shards the TP-local tensors: ranks of one TP group hold equal ones)."""
    if spec.strategy == "tp":
        return tp_rank_memory(model, inputs, opts, spec)
    ranks = tp_kinds(model, spec)
    runs = fork_map(lambda r: tp_rank_memory(model, inputs, opts, spec, rank=r), ranks)
    return max(runs, key=lambda m: m.peak_bytes)


def tp_kinds(model: nn.Module, spec: PlanSpec) -> list[int]:
    """One rank of each kind of a 2-D plan: FSDP's kinds across the TP groups (the ranks
    of one TP group hold equal shards; the group's first stands for it)."""
    return [d * spec.tp_size for d in distinct_ranks(model, spec.dp_size)]


def _recomputed(model: nn.Module, paths: list[str], spec: PlanSpec) -> list[str]:
    if not spec.options.get("checkpoint"):
        return []
    from inspector.distributed.fsdp import shard_units

    return paths or shard_units(model)


class _Largest:
    bytes = 0


@contextmanager
def _largest() -> Iterator[_Largest]:
    """The largest output of one functional collective (all-gather, all-reduce,
    reduce-scatter) in the step: DTensor's redistributions and FSDP's own go through
    `_c10d_functional` ops or the process group's, both seen here."""
    from torch.utils._python_dispatch import TorchDispatchMode

    found = _Largest()

    class Collectives(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            out = func(*args, **(kwargs or {}))
            if func.namespace in ("_c10d_functional", "c10d"):
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        t = local(t)
                        found.bytes = max(found.bytes, t.numel() * t.element_size())
            return out

    with Collectives():
        yield found
