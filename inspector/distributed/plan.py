"""One `--parallel` plan -> the heaviest rank's memory in a training step.

The input the model is inspected with is one rank's batch (the per-GPU micro-batch);
the memory pass's step at that batch is the DDP rank's step, and the FSDP rank runs the
same step on a fake copy sharded `world_size` ways; a TP rank runs it on the whole batch
(every rank of a TP group sees the same batch), a 2-D rank on its TP group's batch.

Under FSDP (alone or across TP groups) ranks differ by the rows of each parameter they
hold: one rank of each kind is run (`rank_kinds`), each on its own, and the heaviest is
the plan's figure. A deep stack of identical blocks is run per kind at two short depths
and scaled (inspector.distributed.layerscale).
"""

from __future__ import annotations

from torch import nn

from inspector.distributed.ddp import ddp_rank_memory
from inspector.distributed.fsdp import distinct_ranks, fsdp_rank_memory
from inspector.distributed.layerscale import SCALE_FROM, identical_blocks, scaled
from inspector.distributed.rankmemory import RankMemory
from inspector.distributed.tp import tp_kinds, tp_rank_memory
from inspector.distributed.tpplan import tensor_parallel_plan
from inspector.distributed.zero import zero1_rank_memory
from inspector.distributed.zero2 import zero2_rank_memory
from inspector.forkmap import fork_map
from inspector.memory.analysis import Analysis
from inspector.memory.step import unique_tensors
from inspector.schema.parallel import PlanSpec

__all__ = ["rank_memory", "rank_memories", "rank_kinds", "PlanUnavailable"]


class PlanUnavailable(RuntimeError):
    """The plan cannot be run here; the message says why."""


def rank_memory(spec: PlanSpec, model: nn.Module, a: Analysis, scale: bool = True) -> RankMemory:
    """The heaviest rank under `spec`, from the memory pass's analysis `a`. With `scale`,
    a deep stack of identical blocks is run at two short depths and scaled to its own
    (inspector.distributed.layerscale: exact on the tested Llama); ZeRO-1 and ZeRO-2
    are always run whole (ZeRO-1's partitions are greedy by size, not per block)."""
    if spec.strategy == "ddp":
        return ddp_rank_memory(a.train, unique_tensors(a.model.parameters()), spec)
    _need_fake(spec, a)
    if spec.strategy == "zero1":
        return zero1_rank_memory(model, a.inputs, a.opts, spec)
    if spec.strategy == "zero2":
        return zero2_rank_memory(model, a.inputs, a.opts, spec)
    runs = rank_memories(spec, model, a, rank_kinds(spec, model), scale)
    return max(runs.values(), key=lambda m: m.peak_bytes)


def rank_kinds(spec: PlanSpec, model: nn.Module) -> list[int]:
    """One rank of each kind a sharded plan has (FSDP's uneven chunks; TP's ranks hold
    equal shards, rank 0 stands for its group); [0] for the plans run whole."""
    if spec.strategy == "fsdp":
        return distinct_ranks(model, spec.world_size)
    if spec.strategy == "fsdp+tp":
        return tp_kinds(model, spec)
    return [0]


def rank_memories(
    spec: PlanSpec, model: nn.Module, a: Analysis, ranks: list[int], scale: bool = True
) -> dict[int, RankMemory]:
    """Each of `ranks` run under an FSDP, TP or 2-D `spec`: side by side in forked
    children, or (a deep stack) one after the other, each scaled from its two short
    depths run side by side."""
    _need_fake(spec, a)
    one = tp_rank_memory if spec.strategy in ("tp", "fsdp+tp") else fsdp_rank_memory
    if one is tp_rank_memory:  # a plan refused for the whole model, here, not in a child
        tensor_parallel_plan(model, spec.tp_size, bool(spec.options.get("sp")))

    def run(m: nn.Module, rank: int) -> RankMemory:
        return one(m, a.inputs, a.opts, spec, rank=rank)

    found = identical_blocks(model) if scale else None
    if found is not None and found[1] >= SCALE_FROM:
        out = {r: scaled(lambda m, r=r: run(m, r), model) for r in ranks}
        if all(m is not None for m in out.values()):
            return out  # type: ignore[return-value]
    return dict(zip(ranks, fork_map(lambda r: run(model, r), ranks), strict=True))


def _need_fake(spec: PlanSpec, a: Analysis) -> None:
    if not a.on_fake:
        raise PlanUnavailable(
            f"{spec.strategy} runs on fake tensors and this model only runs on real ones; "
            "the DDP figure still applies per rank"
        )
