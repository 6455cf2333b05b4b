"""A fit plan as a short list of changes: what each does, what it costs, and its code."""

from __future__ import annotations

import re

from inspector.fitplan.candidate import RISKS, Candidate
from inspector.fitplan.pieces import Pieces
from inspector.fitplan.selective import SNIPPET
from inspector.report import FitChange
from inspector.units import format_bytes

__all__ = ["changes_of", "paths_expression"]

_OPTIMIZER_CODE = {
    "sgd": "torch.optim.SGD(model.parameters(), lr=LR)",
    "momentum": "torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)",
    "adam": "torch.optim.Adam(model.parameters(), lr=LR)",
    "adamw": "torch.optim.AdamW(model.parameters(), lr=LR)",
}
_INDEXED = re.compile(r"^(.*?)(\d+)$")


def paths_expression(paths: list[str]) -> str:
    """Python for the list of paths: a range comprehension where they are consecutive
    members of one container (`[f"h.{i}" for i in range(0, 6)]`), else the list."""
    parts = [_INDEXED.match(p) for p in paths]
    if len(paths) > 2 and all(parts):
        prefixes = {m.group(1) for m in parts}  # type: ignore[union-attr]
        indices = sorted(int(m.group(2)) for m in parts)  # type: ignore[union-attr]
        if len(prefixes) == 1 and indices == list(range(indices[0], indices[-1] + 1)):
            prefix = prefixes.pop()
            return f'[f"{prefix}{{i}}" for i in range({indices[0]}, {indices[-1] + 1})]'
    return "[" + ", ".join(repr(p) for p in paths) + "]"


def _autocast() -> FitChange:
    return FitChange(
        kind="autocast-bf16",
        summary="Run forward and loss under bf16 autocast (weights stay float32)",
        cost="no extra FLOPs (bf16 matmuls run faster on GPUs); low numerical risk: "
        "float32 master weights, autocast keeps reductions and losses in float32",
        risk=RISKS[1],
        snippet='with torch.autocast("cuda", dtype=torch.bfloat16):\n'
        "    loss = loss_fn(model(x), y)\nloss.backward()",
    )


def _checkpoint(c: Candidate, p: Pieces, verified: float | None) -> FitChange:
    paths = list(c.checkpoint)
    total = len(p.blocks)
    shown = ", ".join(paths[:3]) + (" ..." if len(paths) > 3 else "")
    # under FSDP the blocks are wrapped after fully_shard, as the verified run does
    after = " (after fully_shard, on each rank)" if c.gpus > 1 else ""
    return FitChange(
        kind="checkpoint",
        summary=f"Checkpoint {len(paths)} of {total} blocks ({shown}){after}: each recomputes "
        "its forward in backward instead of keeping its activations",
        cost=_recompute_cost(c.extra_compute, verified) + "; no numerical risk",
        risk=RISKS[0],
        snippet="import functools\nfrom torch.utils.checkpoint import checkpoint\n\n"
        f"for name in {paths_expression(paths)}:\n"
        "    block = model.get_submodule(name)\n"
        "    block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)\n"
        "# the same as x = checkpoint(self.layers[i], x, use_reentrant=False) in forward",
        where=paths,
    )


def _selective(c: Candidate, p: Pieces, names: list[str]) -> FitChange:
    return FitChange(
        kind="selective-checkpoint",
        summary=f"Selective checkpointing of {len(names)} block(s): each keeps its matmul "
        "outputs and recomputes the element-wise ops (activations, norms) in backward",
        cost="no matmul FLOPs recomputed, only element-wise ops (memory-bound, cheap); "
        "no numerical risk",
        risk=RISKS[0],
        snippet=SNIPPET.replace("NAMES", paths_expression(names)),
        where=names,
    )


def _recompute_cost(predicted: float, verified: float | None) -> str:
    counted = f", {100 * verified:.1f}% counted in the verified run" if verified is not None else ""
    return (
        f"+{100 * predicted:.1f}% compute predicted (the blocks' forward once more in "
        f"backward){counted}"
    )


def _accumulate(c: Candidate) -> FitChange:
    batch = (c.micro_batch or 1) * c.accumulation * c.gpus
    bn = (
        "; BatchNorm then normalises over micro-batches of "
        f"{c.micro_batch} (low risk: consider GroupNorm or SyncBatchNorm)"
        if c.batchnorm
        else "; no numerical risk"
    )
    ranks = f" per rank ({c.gpus} ranks)" if c.gpus > 1 else ""
    return FitChange(
        kind="accumulate",
        summary=f"Micro-batches of {c.micro_batch}{ranks}, gradients accumulated over "
        f"{c.accumulation} of them per optimizer step (effective batch {batch})",
        cost=f"no extra FLOPs, {c.accumulation} forward/backward passes per step "
        f"(smaller kernels use the GPU less well){bn}",
        risk=RISKS[1] if c.batchnorm else RISKS[0],
        snippet=f"accum = {c.accumulation}  # micro-batches of {c.micro_batch} per step\n"
        "for i, (x, y) in enumerate(loader):  # the loader yields micro-batches\n"
        "    loss = loss_fn(model(x), y) / accum\n"
        "    loss.backward()  # gradients add up across micro-batches\n"
        "    if (i + 1) % accum == 0:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad(set_to_none=True)",
    )


def _optimizer(c: Candidate, p: Pieces) -> FitChange:
    before = p.state.get(p.optimizer, (0, 0))[0]
    after = p.state.get(c.optimizer, (0, 0))[0]
    return FitChange(
        kind="optimizer",
        summary=f"Use {c.optimizer} instead of {p.optimizer}: optimizer state "
        f"{format_bytes(before)} -> {format_bytes(after)}",
        cost="medium numerical risk: other training dynamics, retune the learning rate",
        risk=RISKS[2],
        snippet=f"optimizer = {_OPTIMIZER_CODE[c.optimizer]}",
    )


def _bf16_params() -> FitChange:
    return FitChange(
        kind="bf16-params",
        summary="Keep parameters, gradients and optimizer state in bf16",
        cost="high numerical risk: updates smaller than bf16's precision are lost "
        "(stochastic rounding or a float32 master copy helps)",
        risk=RISKS[3],
        snippet="model.to(torch.bfloat16)\nx = x.to(torch.bfloat16)  # float inputs too",
    )


def _shard(c: Candidate) -> FitChange:
    bf16 = ", computing in bf16 (MixedPrecisionPolicy)" if c.autocast else ""
    policy = (
        "policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)\n"
        if c.autocast
        else ""
    )
    kwargs = "mp_policy=policy" if c.autocast else ""
    per_rank = (c.micro_batch or 0) * c.accumulation
    batch = f"; {per_rank} samples per rank per optimizer step" if c.micro_batch else ""
    return FitChange(
        kind="shard",
        summary=f"Shard parameters, gradients and optimizer state over {c.gpus} GPUs "
        f"(FSDP2, fully_shard per block and the root){bf16}{batch}",
        cost=f"{c.gpus} GPUs; all-gathers and reduce-scatters every step"
        + ("; low numerical risk: bf16 compute and gradient reduction" if c.autocast else ""),
        risk=RISKS[1] if c.autocast else RISKS[0],
        snippet="from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n\n"
        f"{policy}"
        "for block in blocks:  # the repeated layers\n"
        f"    fully_shard(block{', ' + kwargs if kwargs else ''})\n"
        f"fully_shard(model{', ' + kwargs if kwargs else ''})\n"
        f"# torchrun --nproc-per-node {c.gpus} train.py"
        + (f"  # micro-batches of {c.micro_batch} per rank" if c.micro_batch else ""),
    )


def changes_of(c: Candidate, p: Pieces, verified_compute: float | None = None) -> list[FitChange]:
    """The candidate's changes, cheapest first; `verified_compute`: the recompute share
    counted in its run."""
    out = []
    if c.gpus > 1:
        out.append(_shard(c))
    if c.autocast and c.gpus == 1:  # under FSDP, bf16 compute is its policy (_shard)
        out.append(_autocast())
    if c.accumulation > 1:
        out.append(_accumulate(c))
    if c.checkpoint:
        out.append(_checkpoint(c, p, verified_compute))
    if c.selective and c.gpus == 1:
        others = [path for path in p.block_paths if path not in c.checkpoint]
        out.append(_selective(c, p, others))
    if c.changed_optimizer:
        out.append(_optimizer(c, p))
    if c.bf16_params:
        out.append(_bf16_params())
    return out
