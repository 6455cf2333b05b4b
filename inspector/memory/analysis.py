"""The memory analysis of one model and input: runs the tracked steps and collects the
figures the report needs. `inspector.passes.memory` copies them into the report.

Everything runs on fake copies of the model and inputs (nothing real is allocated, the
user's model is untouched), or on a real copy when a model cannot run on fake tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from inspector.context import Context, Inputs
from inspector.memory import scaling
from inspector.memory.shadow import (
    clone_inputs,
    fake_inputs,
    fake_shadow,
    new_fake_mode,
    real_shadow,
)
from inspector.memory.step import ForwardResult, StepOptions, TrainResult, forward_run, train_step
from inspector.memory.tracker import CUDA_BLOCK_BYTES

__all__ = ["Analysis", "step_options", "analyse", "AUTOCAST_DTYPES"]

AUTOCAST_DTYPES = {"float32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Analysis:
    opts: StepOptions
    model: Any  # the shadow the steps ran on
    inputs: Inputs
    train: TrainResult
    forward: ForwardResult
    on_fake: bool
    warnings: list[str] = field(default_factory=list)


def step_options(ctx: Context) -> StepOptions:
    device = ctx.options.device
    return StepOptions(
        optimizer=ctx.options.optimizer,
        autocast=AUTOCAST_DTYPES.get(ctx.options.dtype),
        device=device,
        round_to=CUDA_BLOCK_BYTES if device == "cuda" else 1,
        loss_fn=ctx.loaded.loss_fn,
    )


def analyse(ctx: Context) -> Analysis:
    """The training step and the inference forward, on fake tensors when possible."""
    opts = step_options(ctx)
    fake_mode = ctx.fake_mode or ctx.loaded.fake_mode or new_fake_mode()
    try:
        return _run(
            ctx.model,
            fake_inputs(ctx.inputs, fake_mode),
            replace(opts, fake_mode=fake_mode),
            fake_mode,
        )
    except Exception as exc:
        if ctx.options.fake:
            raise
        # e.g. data-dependent control flow: fake tensors have no values to branch on.
        result = _run(ctx.model, clone_inputs(ctx.inputs), opts, None)
        result.warnings.append(
            f"memory: the model does not run on fake tensors ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); the estimate ran on a real copy."
        )
        return result


def _run(model: Any, inputs: Inputs, opts: StepOptions, fake_mode: Any) -> Analysis:
    shadow = fake_shadow(model, fake_mode) if fake_mode is not None else real_shadow(model)
    train = train_step(shadow, inputs, opts)
    forward = forward_run(shadow, inputs, opts)
    return Analysis(opts, shadow, inputs, train, forward, on_fake=fake_mode is not None)


def fb_peak(train: TrainResult) -> int:
    """Peak of the forward and backward phases (the part that grows with the batch)."""
    return max(train.phase_peaks.get("forward", 0), train.phase_peaks.get("backward", 0))


def rerun(a: Analysis, inputs: Inputs, **changes: Any) -> TrainResult:
    """The training step again (other inputs or dtype), optimizer state kept resident."""
    opts = replace(a.opts, resident_state_bytes=a.train.optimizer_bytes, **changes)
    return train_step(a.model, inputs, opts)


def batch_runs(ctx: Context, a: Analysis) -> list[tuple[int, TrainResult, ForwardResult]]:
    """Runs at the current batch and at twice it."""
    _, b0 = scaling.batch_size_of(ctx.factory, ctx.inputs)
    if not b0:
        return []
    fake_mode = a.opts.fake_mode
    inputs = scaling.inputs_at_batch(ctx.factory, a.inputs, 2 * b0, fake_mode, a.opts.device)
    if fake_mode is not None:
        inputs = fake_inputs(inputs, fake_mode)
    train = rerun(a, inputs)
    train.phase_peaks["optimizer"] = (
        a.train.phase_peaks.get("optimizer", 0) - a.train.input_bytes + train.input_bytes
    )
    return [(b0, a.train, a.forward), (2 * b0, train, forward_run(a.model, inputs, a.opts))]
