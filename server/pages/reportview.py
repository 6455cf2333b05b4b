"""View models of a done report: the figures, the tables and the verdicts the report page
shows. The verdicts are the library's (its findings); nothing here judges a value."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from inspector.repeats import find_folds
from inspector.report import Finding, Report
from inspector.schema.figures import FIGURES
from inspector.schema.findings import SEVERITIES, rules_of
from inspector.units import ACCELERATOR_BUDGETS, format_bytes, format_count

__all__ = [
    "NUMERIC_RULES",
    "parse_report",
    "summary_cards",
    "max_batch_rows",
    "severity_counts",
    "numeric_findings",
    "report_context",
    "folds_of",
]

NUMERIC_RULES = rules_of("numerics")  # the findings the health panel lists


def parse_report(text: str | None, *, modules: bool = False) -> tuple[Report | None, dict]:
    """The report without its long lists (nodes, the timeline, and unless asked, modules),
    and the raw dict. The templates show figures; the scripts read the lists from the raw
    JSON. Validating 5,000 nodes would cost the page most of a second."""
    try:
        raw = json.loads(text) if text else None
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        return None, {}
    slim = {**raw, "nodes": []}
    if not modules:
        slim["modules"] = []
    if isinstance(raw.get("memory"), dict):
        slim["memory"] = {**raw["memory"], "timeline": []}
    try:
        return Report.model_validate(slim), raw
    except ValidationError:
        return None, raw


def summary_cards(report: Report, module_count: int) -> list[dict[str, str]]:
    """The figures at the top of a report: label, value, a line of detail."""
    t, m = report.totals, report.memory
    optimizer = m.optimizer or "no optimizer"
    return [
        _card("params", format_count(t.params),
              f"{format_count(t.trainable_params)} trainable · {format_bytes(t.param_bytes)}"),
        _card("flops_forward", format_count(t.flops_forward),
              f"backward {format_count(t.flops_backward)}"),
        _card("forward_peak_bytes", format_bytes(m.forward_peak_bytes), "one forward, no grad"),
        _card("train_peak_bytes", format_bytes(m.train_peak_bytes),
              f"{optimizer}" + (f" · at {m.train_peak_node}" if m.train_peak_node else "")),
        {"label": "Capture", "value": report.capture.method or "none",
         "detail": f"{report.capture.node_count} nodes · {module_count} modules"},
    ]  # fmt: skip


def _card(figure: str, value: str, detail: str) -> dict[str, str]:
    return {"label": FIGURES[figure].label, "value": value, "detail": detail}


def max_batch_rows(report: Report) -> list[dict[str, Any]]:
    """Largest batch per accelerator size the report computed, smallest size first."""
    known = {int(k): v for k, v in report.memory.max_batch.items() if str(k).isdigit()}
    return [{"budget": format_bytes(b), "batch": known[b]} for b in sorted(known)]


def severity_counts(report: Report) -> dict[str, int]:
    counts = dict.fromkeys(SEVERITIES, 0)
    for finding in report.findings:
        counts[finding.severity] = counts.get(finding.severity, 0) + 1
    return counts


def numeric_findings(report: Report) -> list[Finding]:
    """The library's verdicts on activation values (NaN/Inf, dead or saturated units,
    fp16 overflow, bf16 precision), in the report's order: its thresholds, not ours."""
    return [f for f in report.findings if f.rule in NUMERIC_RULES]


def folds_of(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of identical blocks the module table and the graph fold, as JSON."""
    folds = find_folds(raw.get("modules") or [], raw.get("nodes") or [])
    return [fold.as_json() for fold in folds]


def report_context(report: Report, raw: dict[str, Any]) -> dict[str, Any]:
    """What report.html needs besides the job: `report` is slim, `raw` the whole JSON."""
    nodes = raw.get("nodes") or []
    return {
        "report": report,
        "cards": summary_cards(report, len(raw.get("modules") or [])),
        "max_batch": max_batch_rows(report),
        "severity": severity_counts(report),
        "numeric": numeric_findings(report),
        "has_stats": any(n.get("stats") for n in nodes),
        "has_rows": bool(nodes or raw.get("modules")),
        "budgets": ACCELERATOR_BUDGETS,
        "folds": folds_of(raw),
    }
