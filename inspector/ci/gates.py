"""CI gates: absolute budgets, relative increases against a baseline, and findings.

Pure data in, verdicts out (no torch, no HTTP). The figures are the summary columns the
service keeps for every report (`params`, `flops_forward`, `train_peak_bytes`,
`forward_peak_bytes`, `findings_errors`, `findings_warnings`), and what `gate_figures`
reads from the report itself (`graph_break_count`).
A gate whose figure is missing fails: a limit that cannot be checked must not pass quietly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from inspector.schema.figures import FIGURES as REPORT_FIGURES
from inspector.schema.figures import Figure
from inspector.units import parse_size

__all__ = [
    "GATE_FIGURES",
    "GateResult",
    "Increase",
    "parse_increase",
    "gate_figures",
    "check_budgets",
    "check_increases",
    "check_findings",
    "check_drift",
    "report_drift",
    "gates_table",
    "gates_markdown",
]

Verdict = Literal["pass", "fail", "skipped", "warn"]  # warn: shown, does not fail

# The CLI's short name of each figure a gate can check -> the figure (label, unit, key
# of the report row the API returns).
GATE_FIGURES: dict[str, Figure] = {
    "train_peak": REPORT_FIGURES["train_peak_bytes"],
    "forward_peak": REPORT_FIGURES["forward_peak_bytes"],
    "params": REPORT_FIGURES["params"],
    "flops": REPORT_FIGURES["flops_forward"],
    "graph_breaks": REPORT_FIGURES["graph_break_count"],
}


@dataclass(frozen=True)
class GateResult:
    gate: str  # e.g. "max train_peak", "increase params", "findings"
    figure: str  # the label a person reads
    value: str
    limit: str
    verdict: Verdict
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Increase:
    figure: str  # a key of GATE_FIGURES
    amount: float  # percent, or an absolute amount (bytes or count)
    percent: bool


def _fmt(figure: str, value: float | None) -> str:
    if value is None:
        return "not computed"
    return GATE_FIGURES[figure].format(value)


def _figure(name: str) -> str:
    key = name.strip().lower().replace("-", "_")
    if key not in GATE_FIGURES:
        raise ValueError(f"unknown figure {name!r}: use one of {', '.join(GATE_FIGURES)}")
    return key


def parse_increase(text: str) -> Increase:
    """`train_peak=10%` (relative) or `train_peak=100MiB`, `params=1e6` (absolute)."""
    name, sep, amount = text.partition("=")
    if not sep or not amount.strip():
        raise ValueError(f"{text!r}: write FIGURE=LIMIT, e.g. train_peak=10% or params=1e6")
    figure = _figure(name)
    amount = amount.strip()
    if amount.endswith("%"):
        try:
            return Increase(figure, float(amount[:-1]), percent=True)
        except ValueError:
            raise ValueError(f"{text!r}: {amount!r} is not a percentage") from None
    return Increase(figure, float(parse_size(amount)), percent=False)


def gate_figures(body: Mapping[str, Any]) -> dict[str, Any]:
    """The API's report row, plus each gate figure the row has no column for (graph
    breaks) read from the report it carries; a figure without either stays missing."""
    figures = dict(body)
    report = body.get("report")
    missing = [f for f in GATE_FIGURES.values() if f.key not in figures]
    if missing and isinstance(report, dict):
        from inspector.report import Report

        parsed = Report.model_validate(report)
        figures.update({f.key: f.read(parsed) for f in missing})
    return figures


def check_budgets(figures: Mapping[str, Any], budgets: Mapping[str, float]) -> list[GateResult]:
    """`budgets`: GATE_FIGURES name -> the largest allowed value."""
    results = []
    for name, limit in budgets.items():
        key, label = GATE_FIGURES[name].key, GATE_FIGURES[name].label
        value = figures.get(key)
        verdict: Verdict = "fail" if value is None or value > limit else "pass"
        note = "the report has no such figure" if value is None else ""
        results.append(
            GateResult(
                f"max {name}", label, _fmt(name, value), f"≤ {_fmt(name, limit)}", verdict, note
            )
        )
    return results


def check_increases(
    figures: Mapping[str, Any], baseline: Mapping[str, Any] | None, increases: list[Increase]
) -> list[GateResult]:
    """Each increase limit against `baseline`'s figures; skipped when there is no baseline."""
    return [_increase(figures, baseline, inc) for inc in increases]


def _increase(
    figures: Mapping[str, Any], baseline: Mapping[str, Any] | None, inc: Increase
) -> GateResult:
    key, label = GATE_FIGURES[inc.figure].key, GATE_FIGURES[inc.figure].label
    limit = f"+{inc.amount:g}%" if inc.percent else f"+{_fmt(inc.figure, inc.amount)}"
    value, old = figures.get(key), (baseline or {}).get(key)

    def result(text: str, verdict: Verdict, note: str = "") -> GateResult:
        return GateResult(
            f"increase {inc.figure}", f"{label} vs baseline", text, limit, verdict, note
        )

    if baseline is None:
        return result(_fmt(inc.figure, value), "skipped", "no baseline report")
    if value is None:
        return result("not computed", "fail", "the report has no such figure")
    if old is None or (inc.percent and old == 0):
        return result(_fmt(inc.figure, value), "skipped", "the baseline has no such figure")
    change = value - old
    allowed = old * inc.amount / 100 if inc.percent else inc.amount
    return result(_change_text(inc.figure, value, old), "fail" if change > allowed else "pass")


def _change_text(figure: str, value: float, old: float) -> str:
    change = value - old
    sign = "+" if change >= 0 else "−"
    pct = f", {100 * change / old:+.1f}%".replace("-", "−") if old else ""
    return f"{_fmt(figure, value)} ({sign}{_fmt(figure, abs(change))}{pct})"


def check_findings(figures: Mapping[str, Any], fail_on: str) -> GateResult | None:
    """`fail_on`: error (any error finding fails), warning (errors or warnings), none."""
    if fail_on == "none":
        return None
    errors = int(figures.get("findings_errors") or 0)
    warnings = int(figures.get("findings_warnings") or 0)
    bad = errors + (warnings if fail_on == "warning" else 0)
    value = f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
    limit = "no errors" if fail_on == "error" else "no errors or warnings"
    return GateResult("findings", "Findings", value, limit, "fail" if bad else "pass")


def report_drift(body: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[dict] | None:
    """inspector.compare.setup_drift of the reports two API bodies carry; None when one
    carries none."""
    from inspector.compare import setup_drift
    from inspector.report import Report

    new, old = body.get("report"), baseline.get("report")
    if not isinstance(new, dict) or not isinstance(old, dict):
        return None
    return setup_drift(Report.model_validate(old), Report.model_validate(new))


def check_drift(changes: list[dict] | None, fail: bool = False) -> GateResult:
    """The set-up against the baseline's: a version or option that differs is flagged
    (warn), or fails the build when `fail` (`--fail-on-drift`)."""
    label, limit = "Set-up vs baseline", "same versions and options"
    if changes is None:
        return GateResult("drift", label, "unknown", limit, "skipped", "a report is missing")
    if not changes:
        return GateResult("drift", label, "same", limit, "pass")
    value = "; ".join(f"{d['label']} {d['a']} → {d['b']}" for d in changes)
    note = "figure changes may come from this, not the code"
    return GateResult("drift", label, value, limit, "fail" if fail else "warn", note)


_SHOWN = {"pass": "pass", "fail": "FAIL", "skipped": "skipped", "warn": "WARN"}


def gates_table(results: list[GateResult]) -> str:
    """A plain-text table: figure, value, limit, verdict (and a note where there is one)."""
    head = ("Figure", "Value", "Limit", "Verdict")
    rows = [(r.figure, r.value, r.limit, _SHOWN[r.verdict] + _note(r)) for r in results]
    widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(4)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    rule = "  ".join("-" * w for w in widths)
    header = "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))
    return "\n".join(line.rstrip() for line in [header, rule, *lines])


def _note(result: GateResult) -> str:
    return f" ({result.note})" if result.note else ""


def gates_markdown(results: list[GateResult]) -> str:
    """The gates as a Markdown table with an overall verdict line, for the PR comment."""
    from inspector.render.markdown import escape_markdown

    if not results:
        return ""
    icon = {"pass": "✅ pass", "fail": "❌ **FAIL**", "skipped": "➖ skipped", "warn": "⚠️ drift"}
    rows = ["#### CI gates", "", "| Figure | Value | Limit | Verdict |", "|---|---:|---:|---|"]
    for r in results:
        cells = [r.figure, r.value, r.limit]
        verdict = icon[r.verdict] + (f" ({escape_markdown(r.note)})" if r.note else "")
        rows.append("| " + " | ".join(escape_markdown(c) for c in cells) + f" | {verdict} |")
    failed = sum(r.verdict == "fail" for r in results)
    rows += ["", f"**{failed} gate(s) failed.**" if failed else "**All gates passed.**"]
    return "\n".join(rows)
