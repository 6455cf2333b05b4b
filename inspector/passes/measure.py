"""The memory estimate's ground truth: one real training step, measured
(inspector/memory/measure.py), in `report.memory.measured` beside the estimate's error.

A pass of its own, asked for with the memory pass, because it needs nothing the estimate
works out: once the graph's bounds (or the estimate) say how much memory it takes, it runs
beside the other passes (inspector/beside.py), and is put in the report where it stands
in the order. Run in order, it is the same two steps.

Where the gradients pass's forward and backward are the step's (inspector/memory/
merged.py), they are recorded as its own, and this pass measures only the rest (the copy
of the weights and inputs, the optimizer's state and step): one real forward and backward
fewer for the report, the same figures. Where that forward and backward turn out not to
be the step's, the gradients pass runs the step on its own in their place.
"""

from __future__ import annotations

from dataclasses import replace

from inspector.context import Context, Options
from inspector.detection import training_inputs
from inspector.memory import merged
from inspector.memory.analysis import AUTOCAST_DTYPES, step_options
from inspector.memory.measure import (
    Measurement,
    OptimizerPhase,
    measure,
    measure_optimizer_phase,
    relative_error,
)
from inspector.memory.merged import StepFigures
from inspector.memory.rough import step_bytes
from inspector.memory.step import StepOptions
from inspector.report import MeasuredMemory

__all__ = ["run", "wanted", "compute", "apply", "needs", "records_inference", "separate"]


def wanted(ctx: Context) -> bool:
    return not ctx.options.fake and ctx.options.measure


def records_inference(options: Options) -> bool:
    """Whether the load's input check records the measured step's inference forward
    (inspector/memory/inference.py): a real run on the CPU without autocast, the step's."""
    real = not options.fake and options.measure and options.wants("memory")
    return real and options.device == "cpu" and AUTOCAST_DTYPES.get(options.dtype) is None


def run(ctx: Context) -> None:
    if wanted(ctx) and ctx.results.memory is not None:
        # in order, after the gradients pass: the rest of the step its recording stands
        # for, the step it ran in that one's place, or the step on its own where there is
        # neither (that pass did not run, or its process did not come back)
        recorded = ctx.results.step_recorded
        if isinstance(recorded, StepFigures):
            apply(ctx, compute(ctx))
        else:
            apply(ctx, separate(ctx) if recorded is None else recorded)


def needs(ctx: Context) -> int | None:
    """Bytes the measured step takes: the estimate's training-step peak, or its bound
    before the estimate (it runs on a copy of the model, counted there); its inference
    forward takes less."""
    known = step_bytes(ctx)
    return known.train_peak if known is not None else None


def compute(ctx: Context) -> Measurement | OptimizerPhase | str:
    """The measured step, or what stopped it (as the report's warning says it); where the
    gradients pass's forward and backward are to be the step's (inspector/memory/
    merged.py), the rest of it: its set-up, inference forward and optimizer step."""
    if not merged.planned(ctx):
        return separate(ctx)
    try:
        opts = replace(step_options(ctx), fake_mode=None)
        inference = _recorded_inference(ctx, opts)
        return measure_optimizer_phase(ctx.model, ctx.inputs, opts, inference)
    except Exception as exc:  # noqa: BLE001 - the estimate stands without it
        return _failed(exc)


def separate(ctx: Context) -> Measurement | str:
    """The measured step on its own: its forward and backward too."""
    # a detector given images only gets targets: the memory pass said so already
    with training_inputs(ctx, None):
        try:
            opts = replace(step_options(ctx), fake_mode=None)
            return measure(ctx.model, ctx.inputs, opts, _recorded_inference(ctx, opts))
        except Exception as exc:  # noqa: BLE001 - the estimate stands without it
            return _failed(exc)


def _failed(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return f"memory measurement: {type(exc).__name__}: {lines[0] if lines else ''}"


def _recorded_inference(ctx: Context, opts: StepOptions) -> int | None:
    """The inference forward's peak, recorded at load, where it ran on these inputs (not
    a detector's, given targets here) and as the step would run it."""
    recorded = ctx.results.inference_recorded
    if recorded is None or recorded.inputs is not ctx.inputs:
        return None
    return recorded.peak_bytes if opts.device == "cpu" and opts.autocast is None else None


def apply(ctx: Context, m: Measurement | OptimizerPhase | str) -> None:
    """Into the report next to the estimate; nothing where the estimate did not run (the
    model cannot train here: other passes say why). The rest of a step put together with
    the gradients pass's forward and backward, or the step that pass ran in their place."""
    if ctx.results.memory is None:
        return
    if isinstance(m, OptimizerPhase):
        m = _merged(m, ctx.results.step_recorded)
    if isinstance(m, str):
        ctx.report.meta.warnings.append(m)
        return
    mem = ctx.report.memory
    mem.measured = MeasuredMemory(
        method=m.method,
        device=m.device,
        train_peak_bytes=m.train_peak_bytes,
        saved_activation_bytes=m.saved_activation_bytes,
        forward_peak_bytes=m.forward_peak_bytes,
        train_peak_error=relative_error(mem.train_peak_bytes, m.train_peak_bytes),
        saved_activation_error=relative_error(mem.saved_activation_bytes, m.saved_activation_bytes),
        forward_peak_error=relative_error(mem.forward_peak_bytes, m.forward_peak_bytes),
    )
    ctx.results.memory_measured = m


def _merged(
    phase: OptimizerPhase, recorded: StepFigures | Measurement | str | None
) -> Measurement | str:
    if isinstance(recorded, StepFigures):
        return merged.combine(phase, recorded)
    if recorded is None:  # its process crashed, or it did not run
        return (
            "memory measurement: not taken: the gradients pass, whose forward and backward "
            "it records, did not finish"
        )
    return recorded
