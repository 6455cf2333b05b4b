"""The memory analysis of one model and input: runs the tracked steps and collects the
figures the report needs. `inspector.passes.memory` copies them into the report.

Everything runs on fake copies of the model and inputs (nothing real is allocated, the
user's model is untouched), or on a real copy when a model cannot run on fake tensors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from inspector.context import Context, Inputs
from inspector.health.state import rng_watched
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
    # {seed: training-step peak} when a real copy's peak depends on its random draws
    peak_by_seed: dict[int, int] = field(default_factory=dict)
    step_seconds: float = 0.0  # what the tracked training step took, the first (cold) one
    rerun_seconds: float | None = None  # the last `rerun`: what another one costs, warm

    @property
    def rerun_cost(self) -> float:
        """Seconds a rerun is expected to take: the last one's, else the first step's."""
        return self.step_seconds if self.rerun_seconds is None else self.rerun_seconds


def step_options(ctx: Context) -> StepOptions:
    device = ctx.options.device
    return StepOptions(
        optimizer=ctx.options.optimizer,
        autocast=AUTOCAST_DTYPES.get(ctx.options.dtype),
        device=device,
        round_to=CUDA_BLOCK_BYTES if device == "cuda" else 1,
        loss_fn=ctx.loaded.loss_fn,
        seed=ctx.options.seed,
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
    start = time.perf_counter()
    if fake_mode is not None:
        shadow = fake_shadow(model, fake_mode)
        train, by_seed = train_step(shadow, inputs, opts), {}
    else:
        shadow = real_shadow(model)
        train, by_seed = _real_train(shadow, inputs, opts)
    seconds = time.perf_counter() - start
    forward = forward_run(shadow, inputs, opts)
    a = Analysis(
        opts, shadow, inputs, train, forward, on_fake=fake_mode is not None, step_seconds=seconds
    )
    a.peak_by_seed = by_seed
    if by_seed:
        low, high = min(by_seed.values()), max(by_seed.values())
        a.warnings.append(
            f"memory: the training step's peak depends on its random draws (as layerdrop "
            f"skips whole layers): {low:,} B to {high:,} B over seeds "
            f"{', '.join(map(str, by_seed))}; the estimate is the larger, and other steps "
            "may differ"
        )
    return a


def _real_train(shadow: Any, inputs: Inputs, opts: StepOptions) -> tuple[TrainResult, dict]:
    """A model that runs only on a real copy branches on values, and a random draw may be
    one of them: wav2vec2's layerdrop skips a whole layer when `torch.rand([])` is under
    its rate (a tiny config's peak: 1.05 MB, or 0.75 MB at 2 of 6 seeds). When the step
    drew from torch's generators, a second step under the next seed; the larger peak is
    kept, and ({seed: peak}) returned when the two differ. The caller's RNG is restored."""
    runs: dict[int, TrainResult] = {}
    with torch.random.fork_rng(devices=[]):
        for seed in (opts.seed, opts.seed + 1):
            torch.manual_seed(seed)
            with rng_watched() as watch:
                runs[seed] = train_step(shadow, inputs, opts)
            if not watch.drew:
                break
    worst = max(runs.values(), key=lambda r: r.peak_bytes)
    peaks = {seed: r.peak_bytes for seed, r in runs.items()}
    return worst, peaks if len(set(peaks.values())) > 1 else {}


def fb_peak(train: TrainResult) -> int:
    """Peak of the forward and backward phases (the part that grows with the batch)."""
    return max(train.phase_peaks.get("forward", 0), train.phase_peaks.get("backward", 0))


def rerun(a: Analysis, inputs: Inputs, **changes: Any) -> TrainResult:
    """The training step again (other inputs or dtype), optimizer state kept resident."""
    opts = replace(a.opts, resident_state_bytes=a.train.optimizer_bytes, **changes)
    start = time.perf_counter()
    result = train_step(a.model, inputs, opts)
    a.rerun_seconds = time.perf_counter() - start
    return result


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
