"""The summary columns a job row keeps beside its report, for lists, filters and compares."""

from __future__ import annotations

from typing import Any

__all__ = ["summary_columns", "SUMMARY_COLUMNS"]

SUMMARY_COLUMNS = (
    "params",
    "flops_forward",
    "train_peak_bytes",
    "forward_peak_bytes",
    "findings_errors",
    "findings_warnings",
    "capture_method",
)


def summary_columns(report: dict[str, Any]) -> dict[str, Any]:
    """Pull the summary figures out of a report dict; absent numbers stay None."""
    totals = report.get("totals") or {}
    memory = report.get("memory") or {}
    capture = report.get("capture") or {}
    findings = report.get("findings") or []
    severities = [f.get("severity") for f in findings if isinstance(f, dict)]
    return {
        "params": _int_or_none(totals.get("params")),
        "flops_forward": _int_or_none(totals.get("flops_forward")),
        "train_peak_bytes": _int_or_none(memory.get("train_peak_bytes")),
        "forward_peak_bytes": _int_or_none(memory.get("forward_peak_bytes")),
        "findings_errors": severities.count("error"),
        "findings_warnings": severities.count("warning"),
        "capture_method": capture.get("method"),
    }


def _int_or_none(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)
