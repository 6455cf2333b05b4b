"""One `--parallel` plan -> the heaviest rank's memory in a training step.

The input the model is inspected with is one rank's batch (the per-GPU micro-batch);
the memory pass's step at that batch is the DDP rank's step, and the FSDP rank runs the
same step on a fake copy sharded `world_size` ways; a TP rank runs it on the whole batch
(every rank of a TP group sees the same batch), a 2-D rank on its TP group's batch.
"""

from __future__ import annotations

from torch import nn

from inspector.distributed.ddp import ddp_rank_memory
from inspector.distributed.fsdp import fsdp_heaviest
from inspector.distributed.layerscale import scaled
from inspector.distributed.rankmemory import RankMemory
from inspector.distributed.tp import fsdp_tp_heaviest
from inspector.distributed.zero import zero1_rank_memory
from inspector.distributed.zero2 import zero2_rank_memory
from inspector.memory.analysis import Analysis
from inspector.memory.step import unique_tensors
from inspector.schema.parallel import PlanSpec

__all__ = ["rank_memory", "PlanUnavailable"]


class PlanUnavailable(RuntimeError):
    """The plan cannot be run here; the message says why."""


def rank_memory(spec: PlanSpec, model: nn.Module, a: Analysis, scale: bool = True) -> RankMemory:
    """The heaviest rank under `spec`, from the memory pass's analysis `a`. With `scale`,
    a deep stack of identical blocks is run at two short depths and scaled to its own
    (inspector.distributed.layerscale: exact on the tested Llama); ZeRO-1 and ZeRO-2
    are always run whole (ZeRO-1's partitions are greedy by size, not per block)."""
    if spec.strategy == "ddp":
        return ddp_rank_memory(a.train, unique_tensors(a.model.parameters()), spec)
    if not a.on_fake:
        raise PlanUnavailable(
            f"{spec.strategy} runs on fake tensors and this model only runs on real ones; "
            "the DDP figure still applies per rank"
        )
    if spec.strategy == "zero1":
        return zero1_rank_memory(model, a.inputs, a.opts, spec)
    if spec.strategy == "zero2":
        return zero2_rank_memory(model, a.inputs, a.opts, spec)

    def run(m: nn.Module) -> RankMemory:
        if spec.strategy in ("tp", "fsdp+tp"):
            return fsdp_tp_heaviest(m, a.inputs, a.opts, spec)
        return fsdp_heaviest(m, a.inputs, a.opts, spec)

    return (scale and scaled(run, model)) or run(model)
