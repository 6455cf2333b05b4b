"""Display helpers shared by the renderers: shapes, FLOPs, budgets and the key figures.

Pure functions over plain values and the Report; no rich, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inspector.report import FitPlan, Report
from inspector.schema.figures import FIGURES, SUMMARY_FIGURES
from inspector.units import format_bytes, format_flops

__all__ = [
    "Figure",
    "format_flops",
    "format_shape",
    "format_shapes",
    "format_batch",
    "budget_label",
    "max_batch_at",
    "percent_change",
    "key_figures",
    "failed_attempts",
    "fit_headline",
]

GIB = 1024**3
# The budgets the summaries quote: a common 24 GiB card and an 80 GiB datacentre one.
SUMMARY_BUDGETS = (24 * GIB, 80 * GIB)


def format_shape(shape: Sequence[int | str]) -> str:
    """[B, 64, 112, 112]: symbolic dims stay names."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def format_shapes(shapes: Sequence[Sequence[int | str]], limit: int = 3) -> str:
    """Several outputs side by side; past `limit`, the rest is counted."""
    shown = [format_shape(s) for s in shapes[:limit]]
    if len(shapes) > limit:
        shown.append(f"… (+{len(shapes) - limit})")
    return ", ".join(shown)


def format_batch(n: int | None) -> str:
    """Largest batch: 0 means not even a batch of 1 fits."""
    if n is None:
        return "-"
    return "does not fit" if n == 0 else f"{n:,}"


def budget_label(budget_bytes: int | str) -> str:
    """24 * 2**30 -> '24 GiB' (whole GiB stay whole)."""
    n = int(budget_bytes)
    if n % GIB == 0:
        return f"{n // GIB} GiB"
    return format_bytes(n)


def max_batch_at(report: Report, budget_bytes: int) -> int | None:
    """The largest batch for one budget, or None when it was not computed."""
    return report.memory.max_batch.get(str(budget_bytes))


def percent_change(new: float, old: float) -> float | None:
    """(new - old) / old in percent; None when old is 0 (no meaningful ratio)."""
    if old == 0:
        return None
    return (new - old) / abs(old) * 100.0


@dataclass(frozen=True)
class Figure:
    """One key figure of a report: a label, a raw value and how to show it."""

    label: str
    value: int | float | None
    fmt: Callable[[int | float | None], str]


def key_figures(report: Report) -> list[Figure]:
    """The figures a summary quotes, in order; values are None when not computed."""
    figures = [
        Figure(f.label, f.read(report), f.format) for f in (FIGURES[key] for key in SUMMARY_FIGURES)
    ]
    for budget in SUMMARY_BUDGETS:
        label = f"Largest batch @ {budget_label(budget)}"
        figures.append(Figure(label, max_batch_at(report, budget), format_batch))
    return figures


def failed_attempts(report: Report) -> list[str]:
    """'fx: TypeError at model.py:12: message' for each capture attempt that failed."""
    lines = []
    for attempt in report.capture.attempts:
        if attempt.ok:
            continue
        text = attempt.method
        if attempt.error_type:
            text += f": {attempt.error_type}"
        if attempt.location:
            text += f" at {attempt.location}"
        if attempt.error:
            first = attempt.error.strip().splitlines()[0] if attempt.error.strip() else ""
            text += f": {first}" if first else ""
        lines.append(text)
    return lines


def fit_headline(plan: FitPlan) -> str:
    """One line: the verdict, the GPUs and the peaks, e.g. for a summary or a PR comment."""
    budget = format_bytes(plan.budget_bytes)
    if plan.verified_peak_bytes is None:
        return f"no fit plan for {budget}"
    verdict = "fits" if plan.found else "no plan found within these changes; closest"
    gpus = f" on {plan.gpus} GPUs" if plan.gpus > 1 else ""
    predicted = (
        f"predicted {format_bytes(plan.predicted_peak_bytes)}, "
        if plan.predicted_peak_bytes is not None
        else ""
    )
    return (
        f"{verdict} {budget}{gpus}: {predicted}verified {format_bytes(plan.verified_peak_bytes)}"
        f" (now {format_bytes(plan.baseline_peak_bytes)})"
    )
