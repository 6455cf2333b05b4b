"""The report's key figures: one label, one unit and one way to read each, for every view.

The terminal, the report and compare pages, the PR Markdown, `inspector.compare` and the
CI gates all take their labels and readers from `FIGURES`, so a number is called the
same everywhere. A figure's key is also its name in the API's report rows and in
`compare.summary` (a stable contract: see README "The report").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from inspector.report import Report
from inspector.units import format_bytes, format_count, format_flops

__all__ = ["Figure", "FIGURES", "SUMMARY_FIGURES", "figure", "format_value"]

Unit = Literal["bytes", "count", "flops"]
_FORMATS: dict[str, Callable[[int | float | None], str]] = {
    "bytes": format_bytes,
    "count": format_count,
    "flops": format_flops,
}


def _findings(severity: str) -> Callable[[Report], int]:
    return lambda r: sum(1 for f in r.findings if f.severity == severity)


@dataclass(frozen=True)
class Figure:
    """One number of a report. Every figure is "lower is cheaper"."""

    key: str
    label: str
    unit: Unit
    read: Callable[[Report], int | float | None]

    def format(self, value: int | float | None) -> str:
        return format_value(value, self.unit)

    def of(self, report: Report) -> str:
        """The figure of `report`, formatted."""
        return self.format(self.read(report))


def format_value(value: int | float | None, unit: str) -> str:
    return _FORMATS[unit](value)


_ALL = (
    Figure("params", "Parameters", "count", lambda r: r.totals.params),
    Figure("trainable_params", "Trainable parameters", "count",
           lambda r: r.totals.trainable_params),
    Figure("flops_forward", "Forward FLOPs", "flops", lambda r: r.totals.flops_forward),
    Figure("flops_backward", "Backward FLOPs", "flops", lambda r: r.totals.flops_backward),
    Figure("param_bytes", "Parameter memory", "bytes",
           lambda r: r.memory.param_bytes or r.totals.param_bytes),
    Figure("grad_bytes", "Gradient memory", "bytes", lambda r: r.memory.grad_bytes),
    Figure("optimizer_bytes", "Optimizer state", "bytes", lambda r: r.memory.optimizer_bytes),
    Figure("saved_activation_bytes", "Saved activations", "bytes",
           lambda r: r.memory.saved_activation_bytes),
    Figure("forward_peak_bytes", "Forward peak", "bytes", lambda r: r.memory.forward_peak_bytes),
    Figure("train_peak_bytes", "Training-step peak", "bytes",
           lambda r: r.memory.train_peak_bytes),
    Figure("node_count", "Graph nodes", "count", lambda r: r.capture.node_count),
    Figure("graph_break_count", "Graph breaks (torch.compile)", "count",
           lambda r: r.compile.graph_break_count),
    Figure("kv_bytes_per_token", "KV cache per token", "bytes",
           lambda r: r.serving.kv_bytes_per_token),
    Figure("prefill_peak_bytes", "Prefill peak", "bytes",
           lambda r: r.serving.prefill_peak_bytes),
    Figure("findings_errors", "Errors", "count", _findings("error")),
    Figure("findings_warnings", "Warnings", "count", _findings("warning")),
)  # fmt: skip
FIGURES: dict[str, Figure] = {f.key: f for f in _ALL}

# The figures a summary (terminal, Markdown, `inspector submit`) quotes, in order.
SUMMARY_FIGURES = (
    "params",
    "trainable_params",
    "flops_forward",
    "param_bytes",
    "saved_activation_bytes",
    "forward_peak_bytes",
    "train_peak_bytes",
    "kv_bytes_per_token",
    "graph_break_count",
)


def figure(key: str) -> Figure:
    return FIGURES[key]
