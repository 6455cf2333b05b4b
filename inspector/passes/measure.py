"""The memory estimate's ground truth: one real training step, measured
(inspector/memory/measure.py), in `report.memory.measured` beside the estimate's error.

A pass of its own, asked for with the memory pass, because it needs nothing the estimate
works out: once the graph's bounds (or the estimate) say how much memory it takes, it runs
beside the other passes (inspector/beside.py), and is put in the report where it stands
in the order. Run in order, it is the same two steps.
"""

from __future__ import annotations

from dataclasses import replace

from inspector.context import Context, Options
from inspector.detection import training_inputs
from inspector.memory.analysis import AUTOCAST_DTYPES, step_options
from inspector.memory.measure import Measurement, measure, relative_error
from inspector.memory.rough import step_bytes
from inspector.memory.step import StepOptions
from inspector.report import MeasuredMemory

__all__ = ["run", "wanted", "compute", "apply", "needs", "records_inference"]


def wanted(ctx: Context) -> bool:
    return not ctx.options.fake and ctx.options.measure


def records_inference(options: Options) -> bool:
    """Whether the load's input check records the measured step's inference forward
    (inspector/memory/inference.py): a real run on the CPU without autocast, the step's."""
    real = not options.fake and options.measure and options.wants("memory")
    return real and options.device == "cpu" and AUTOCAST_DTYPES.get(options.dtype) is None


def run(ctx: Context) -> None:
    if wanted(ctx) and ctx.results.memory is not None:
        apply(ctx, compute(ctx))


def needs(ctx: Context) -> int | None:
    """Bytes the measured step takes: the estimate's training-step peak, or its bound
    before the estimate (it runs on a copy of the model, counted there); its inference
    forward takes less."""
    known = step_bytes(ctx)
    return known.train_peak if known is not None else None


def compute(ctx: Context) -> Measurement | str:
    """The measured step, or what stopped it (as the report's warning says it)."""
    # a detector given images only gets targets: the memory pass said so already
    with training_inputs(ctx, None):
        try:
            opts = replace(step_options(ctx), fake_mode=None)
            return measure(ctx.model, ctx.inputs, opts, _recorded_inference(ctx, opts))
        except Exception as exc:  # noqa: BLE001 - the estimate stands without it
            lines = str(exc).strip().splitlines()
            return f"memory measurement: {type(exc).__name__}: {lines[0] if lines else ''}"


def _recorded_inference(ctx: Context, opts: StepOptions) -> int | None:
    """The inference forward's peak, recorded at load, where it ran on these inputs (not
    a detector's, given targets here) and as the step would run it."""
    recorded = ctx.results.inference_recorded
    if recorded is None or recorded.inputs is not ctx.inputs:
        return None
    return recorded.peak_bytes if opts.device == "cpu" and opts.autocast is None else None


def apply(ctx: Context, m: Measurement | str) -> None:
    """Into the report next to the estimate; nothing where the estimate did not run (the
    model cannot train here: other passes say why)."""
    if ctx.results.memory is None:
        return
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
