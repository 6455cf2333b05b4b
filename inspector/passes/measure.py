"""The memory estimate's ground truth: one real training step, measured
(inspector/memory/measure.py), in `report.memory.measured` beside the estimate's error.

A pass of its own, asked for with the memory pass, because it needs nothing the estimate
works out: once the graph's bounds (or the estimate) say how much memory it takes, it runs
beside the other passes (inspector/beside.py), and is put in the report where it stands
in the order. Run in order, it is the same two steps.
"""

from __future__ import annotations

from dataclasses import replace

from inspector.context import Context
from inspector.detection import training_inputs
from inspector.memory.analysis import step_options
from inspector.memory.measure import Measurement, measure, relative_error
from inspector.memory.rough import step_bytes
from inspector.report import MeasuredMemory

__all__ = ["run", "wanted", "compute", "apply", "needs"]


def wanted(ctx: Context) -> bool:
    return not ctx.options.fake and ctx.options.measure


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
            return measure(ctx.model, ctx.inputs, replace(step_options(ctx), fake_mode=None))
        except Exception as exc:  # noqa: BLE001 - the estimate stands without it
            lines = str(exc).strip().splitlines()
            return f"memory measurement: {type(exc).__name__}: {lines[0] if lines else ''}"


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
