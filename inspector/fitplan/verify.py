"""A candidate run for real on fake tensors: the memory pass's training step on a fresh
fake copy of the model, with the candidate's changes made the way a user would make them.

- checkpointed blocks: `torch.utils.checkpoint.checkpoint(block, ..., use_reentrant=False)`
  (inspector.memory.checkpointing);
- bf16 autocast: `torch.autocast(..., dtype=torch.bfloat16)` around forward and loss;
- bf16 parameters: `model.to(torch.bfloat16)` and the float inputs cast to bf16;
- the optimizer the candidate names, its state allocated by a first step;
- the micro-batch: the inputs rebuilt at it; accumulation: two micro-steps (forward and
  backward twice, gradients accumulating) before the optimizer step: the steady state;
- sharding: FSDP2 (`fully_shard` per block + root, the candidate's blocks checkpointed
  after it), the heaviest rank, through the distributed planner
  (inspector.distributed.fsdp); bf16 compute there is
  `MixedPrecisionPolicy(param_dtype=bf16)`, not autocast, whose cache would keep the
  bf16 cast of every gathered block to the end of forward (measured: 30 MB a rank instead
  of 13 MB on a 6-block, 25 MB model over 16 ranks).
FLOPs are counted with `torch.utils.flop_counter.FlopCounterMode` over forward and
backward, with and without the checkpointing: the difference is what the recompute costs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode

from inspector.context import Context, Inputs
from inspector.distributed.fsdp import fsdp_heaviest
from inspector.fitplan.candidate import Candidate
from inspector.fitplan.predict import Phases
from inspector.fitplan.selective import selective
from inspector.memory import scaling
from inspector.memory.advice import blocks
from inspector.memory.analysis import Analysis
from inspector.memory.checkpointing import checkpointed
from inspector.memory.shadow import fake_inputs, fake_shadow
from inspector.memory.step import StepOptions, train_step
from inspector.schema.parallel import PlanSpec

__all__ = [
    "Verified",
    "verify",
    "verify_sharded",
    "count_flops",
    "micro_inputs",
    "ACCUMULATION_RUN",
]

ACCUMULATION_RUN = 2  # micro-steps run: the second is the steady state of any longer loop


@dataclass(frozen=True)
class Verified:
    peak_bytes: int
    grad_bytes: int = 0
    phases: Phases | None = None  # sharded runs


def micro_inputs(ctx: Context, a: Analysis, micro_batch: int | None) -> Inputs:
    """The inputs at the micro-batch, as fake tensors (the memory pass's own at its batch)."""
    _, batch = scaling.batch_size_of(ctx.factory, ctx.inputs)
    if micro_batch is None or micro_batch == batch:
        return a.inputs
    mode = a.opts.fake_mode
    return fake_inputs(
        scaling.inputs_at_batch(ctx.factory, a.inputs, micro_batch, mode, a.opts.device), mode
    )


def _options(a: Analysis, c: Candidate, micro_steps: int) -> StepOptions:
    autocast = torch.bfloat16 if c.autocast else a.opts.autocast
    return replace(a.opts, optimizer=c.optimizer, autocast=autocast, micro_steps=micro_steps,
                   resident_state_bytes=None)  # fmt: skip


def _bf16_inputs(inputs: Inputs) -> Inputs:
    def cast(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.to(torch.bfloat16)
        return x

    return Inputs(tree_map(cast, inputs.args), tree_map(cast, inputs.kwargs), inputs.dims)


def _to_bf16(model: torch.nn.Module) -> None:
    """`model.to(torch.bfloat16)` for floating parameters and buffers, ties kept. Done by
    hand: `Module.to` swaps tensors in place, which fake tensors (weakly referenced by
    their mode) refuse."""
    done: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and p.is_floating_point():
                if id(p) not in done:
                    cast = p.detach().to(torch.bfloat16)
                    done[id(p)] = torch.nn.Parameter(cast, requires_grad=p.requires_grad)
                module._parameters[name] = done[id(p)]
        for name, b in module._buffers.items():
            if b is not None and b.is_floating_point():
                module._buffers[name] = b.to(torch.bfloat16)


def _shadow(ctx: Context, a: Analysis, c: Candidate) -> tuple[torch.nn.Module, Inputs]:
    """A fresh fake copy of the model and the inputs at the micro-batch, as `c` has them."""
    mode = a.opts.fake_mode
    inputs = micro_inputs(ctx, a, c.micro_batch)
    shadow = fake_shadow(ctx.model, mode)
    if c.bf16_params:
        with mode:
            _to_bf16(shadow)
            inputs = _bf16_inputs(inputs)
    return shadow, inputs


def _selective_paths(c: Candidate, a: Analysis) -> list[str]:
    """The blocks under selective checkpointing: every block not fully checkpointed."""
    if not c.selective:
        return []
    return [path for path, _ in blocks(a.model) if path and path not in c.checkpoint]


def verify(ctx: Context, a: Analysis, c: Candidate) -> Verified:
    """The candidate's training step on fake tensors: its peak."""
    shadow, inputs = _shadow(ctx, a, c)
    steps = min(c.accumulation, ACCUMULATION_RUN)
    with checkpointed(shadow, list(c.checkpoint)), selective(shadow, _selective_paths(c, a)):
        train = train_step(shadow, inputs, _options(a, c, steps))
    return Verified(train.peak_bytes, train.grad_bytes)


def count_flops(ctx: Context, a: Analysis, c: Candidate) -> tuple[int, int]:
    """(FLOPs of one micro-step as `c` runs it, of which recompute): forward + backward
    counted with and without its checkpointing. Counted apart from the tracked step:
    under FlopCounterMode the recomputed tensors outlive their backward (measured: a
    5-block checkpointed step then peaks 1.9x higher), so the two do not mix."""
    shadow, inputs = _shadow(ctx, a, c)
    opts = replace(_options(a, c, 1), optimizer="none")
    counted = []
    for paths, others in ((list(c.checkpoint), _selective_paths(c, a)), ([], [])):
        counter = FlopCounterMode(display=False)
        with checkpointed(shadow, paths), selective(shadow, others), counter:
            train_step(shadow, inputs, opts)
        counted.append(counter.get_total_flops())
    return counted[0], counted[0] - counted[1]


def verify_sharded(ctx: Context, a: Analysis, c: Candidate) -> Verified:
    """The heaviest FSDP rank of the candidate (one micro-step; with accumulation the
    rank's gradient shards stay resident through the next micro-step's forward, added)."""
    inputs = micro_inputs(ctx, a, c.micro_batch)
    options: dict[str, str | int | bool] = {"checkpoint": bool(c.checkpoint)}
    if c.autocast:  # bf16 compute the FSDP way: autocast would cache every gathered cast
        options["param_dtype"] = "bf16"
    spec = PlanSpec("fsdp", c.gpus, options)
    opts = replace(_options(a, c, 1), autocast=a.opts.autocast)
    rank = fsdp_heaviest(ctx.model, inputs, opts, spec, recompute=list(c.checkpoint))
    held = rank.grad_bytes if c.accumulation > 1 else 0
    peaks = rank.phase_peaks
    phases = Phases(peaks.get("forward", rank.peak_bytes), peaks.get("backward", rank.peak_bytes),
                    peaks.get("optimizer", 0), rank.phase_labels.get("backward"))  # fmt: skip
    return Verified(rank.peak_bytes + held, rank.grad_bytes, phases)
