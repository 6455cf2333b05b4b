"""What the memory pass measured, in the form the fit prediction composes.

All of it comes from runs already made (the training step at the input's batch and at
twice it, the bf16-autocast re-run, which blocks' ops saved what) plus one fake
optimizer step per optimizer a plan may switch to: no new guesses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inspector.context import Context
from inspector.fitplan.selective import selective
from inspector.memory import advice, scaling, setups
from inspector.memory.analysis import Analysis, fb_peak, rerun
from inspector.memory.step import unique_tensors

__all__ = ["Block", "Pieces", "gather"]


@dataclass(frozen=True)
class Block:
    path: str
    kind: str
    saving_bytes: int  # saved bytes its checkpointing frees, at the input's batch
    flops: int  # its forward FLOPs at the input's batch: what recomputing it costs


@dataclass(frozen=True)
class Pieces:
    batch: int | None  # the input's batch (None: no batch dim)
    optimizer: str
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    grad_bytes: int
    saved_bytes: int
    fixed_bytes: float  # forward/backward peak = fixed + per_sample * batch
    per_sample_bytes: float
    # optimizer -> (state bytes, temporaries of its step)
    state: dict[str, tuple[int, int]] = field(default_factory=dict)
    bf16_ratio: float | None = None  # activations under bf16 autocast / as measured
    blocks: list[Block] = field(default_factory=list)
    step_flops: int = 0  # forward + backward FLOPs at the input's batch
    float32_params: bool = True
    batchnorm: bool = False
    # selective checkpointing of every block: forward/backward peak freed, at the batch
    selective_saving_bytes: int = 0
    block_paths: list[str] = field(default_factory=list)  # every block, saving or not
    # modules before the first block (embeddings), their ancestors left out
    before_blocks: frozenset[str] = frozenset()


def gather(ctx: Context, a: Analysis, optimizers: list[str], notes: list[str]) -> Pieces:
    """The pieces; what could not be measured is said in `notes`."""
    _, batch = scaling.batch_size_of(ctx.factory, ctx.inputs)
    t, mem = a.train, ctx.report.memory
    static = t.param_bytes + t.buffer_bytes + t.input_bytes + t.optimizer_bytes
    fixed, per_sample = float(fb_peak(t)), 0.0
    if mem.per_sample_bytes is not None and mem.fixed_bytes is not None and batch:
        fixed, per_sample = float(mem.fixed_bytes), float(mem.per_sample_bytes)
    bf16 = ctx.results.memory_bf16
    ratio = None
    if bf16 is not None and fb_peak(t) > static:
        ratio = max(0.0, (bf16.fb_peak_bytes - static) / (fb_peak(t) - static))
    trainable = [p for p in unique_tensors(a.model.parameters()) if p.requires_grad]
    return Pieces(
        batch=batch,
        optimizer=a.opts.optimizer,
        param_bytes=t.param_bytes,
        buffer_bytes=t.buffer_bytes,
        input_bytes=t.input_bytes,
        grad_bytes=t.grad_bytes,
        saved_bytes=t.saved_bytes,
        fixed_bytes=fixed,
        per_sample_bytes=per_sample,
        state=setups.step_costs(trainable, optimizers, a.opts.fake_mode),
        bf16_ratio=ratio,
        blocks=_blocks(ctx, a),
        step_flops=ctx.report.totals.flops_forward + ctx.report.totals.flops_backward,
        float32_params=any(p.dtype == torch.float32 for p in trainable),
        batchnorm=any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                      for m in ctx.model.modules()),
        selective_saving_bytes=_selective_saving(a, notes),
        block_paths=[path for path, _ in advice.blocks(a.model) if path],
        before_blocks=_before_blocks(a.model),
    )  # fmt: skip


def _before_blocks(model: torch.nn.Module) -> frozenset[str]:
    """Module paths registered before the first block (forward order, as a rule), the
    containers of blocks left out."""
    paths = [path for path, _ in advice.blocks(model) if path]
    names = [name for name, _ in model.named_modules()]
    first = min((names.index(p) for p in paths if p in names), default=len(names))
    return frozenset(
        n for n in names[:first] if n and not any(p.startswith(n + ".") for p in paths)
    )


def _selective_saving(a: Analysis, notes: list[str]) -> int:
    """What selective checkpointing of every block takes off the forward/backward peak,
    measured: the step run that way (optimizer state resident, as in the advice runs).
    0, with a note, where it does not run (GPT-2's blocks, on torch 2.13: a recomputed
    `aten.slice` is not found in the selective cache)."""
    paths = [path for path, _ in advice.blocks(a.model) if path]
    if not paths:
        return 0
    try:
        with selective(a.model, paths):
            run = rerun(a, a.inputs)
    except Exception as exc:  # the search goes on without it
        for param in a.model.parameters():  # a step that stopped in backward left these
            param.grad = None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        notes.append(f"selective checkpointing left out: it fails here ({type(exc).__name__}: "
                     f"{first})")  # fmt: skip
        return 0
    return max(0, fb_peak(a.train) - fb_peak(run))


def _blocks(ctx: Context, a: Analysis) -> list[Block]:
    flops = {m.path: m.flops_forward for m in ctx.report.modules}
    savings = advice.block_savings(a.model, a.train.saved, a.train.module_outputs)
    order = {path: i for i, (path, _) in enumerate(advice.blocks(a.model))}
    found = [Block(path, kind, saving, flops.get(path, 0)) for saving, path, kind in savings]
    return sorted(found, key=lambda b: order.get(b.path, len(order)))  # model order
