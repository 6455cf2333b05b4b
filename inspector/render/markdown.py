"""A compact Markdown summary of a Report, fit for a pull-request comment.

Imports neither torch nor rich: the web process and `inspector submit` call it.
Everything that comes from the user's model (names, messages) is escaped, so a module
called `<script>` or `a|b` cannot inject HTML or break the table.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from urllib.parse import quote

from inspector.compare import setup_drift
from inspector.render.format import (
    Figure,
    budget_label,
    failed_attempts,
    fit_headline,
    key_figures,
    percent_change,
)
from inspector.report import Finding, Report
from inspector.schema.findings import SEVERITIES
from inspector.units import format_bytes

__all__ = ["render_markdown", "escape_markdown"]

MAX_FINDINGS = 10
_SPECIAL = re.compile(r"([\\`*_\[\]|~])")
# Characters a URL keeps as they are; spaces, quotes, brackets and parentheses get %-encoded.
_URL_SAFE = ":/?#@!$&*+,;=%-._~"


def escape_markdown(text: object) -> str:
    """Inline-safe text: one line, HTML entities escaped, Markdown punctuation backslashed."""
    one_line = " ".join(str(text).split())
    return _SPECIAL.sub(r"\\\1", html.escape(one_line, quote=False))


def render_markdown(
    report: Report, *, link: str | None = None, baseline: Report | None = None
) -> str:
    """The summary: key figures (with deltas against `baseline`), findings, capture, link."""
    parts = [_title(report, baseline)]
    if report.status == "failed":
        parts.append(_failure(report))
    else:
        drift = _drift(report, baseline) if baseline is not None else ""
        parts += [drift, _figures_table(report, baseline), _fit(report)]
        parts += [_distributed(report, baseline), _findings(report.findings)]
        parts.append(_capture(report))
    if link:
        parts.append(_link(link))
    return "\n\n".join(p for p in parts if p) + "\n"


def _name(report: Report) -> str:
    return report.meta.source_name or report.meta.entrypoint or "model"


def _title(report: Report, baseline: Report | None) -> str:
    title = f"### Model Graph Inspector: {escape_markdown(_name(report))}"
    if baseline is not None:
        title += f"\n\nCompared with the baseline {escape_markdown(_name(baseline))}."
    return title


def _failure(report: Report) -> str:
    error = report.error
    if error is None:
        return "**Failed** (no error recorded)."
    stage = f" during {escape_markdown(error.stage)}" if error.stage else ""
    return f"**Failed** ({escape_markdown(error.kind)}{stage}): {escape_markdown(error.message)}"


def _drift(report: Report, baseline: Report) -> str:
    """The versions and options that differ from the baseline, before the figures."""
    changes = setup_drift(baseline, report)
    if not changes:
        return ""
    items = ", ".join(
        f"{escape_markdown(d['label'])} {escape_markdown(d['a'])} → {escape_markdown(d['b'])}"
        for d in changes
    )
    return (
        f"⚠️ **Set-up differs from the baseline:** {items}. "
        "Changes in the figures may come from this, not from the code."
    )


# -- key figures ------------------------------------------------------------------------


def _figures_table(report: Report, baseline: Report | None) -> str:
    figures = key_figures(report)
    if baseline is None:
        rows = ["| | Value |", "|---|---:|"]
        rows += [f"| {f.label} | {f.fmt(f.value)} |" for f in figures if f.value is not None]
        return "\n".join(rows) if len(rows) > 2 else ""
    rows = ["| | This report | Baseline | Change |", "|---|---:|---:|---:|"]
    for new, old in zip(figures, key_figures(baseline), strict=True):
        if new.value is None and old.value is None:
            continue
        cells = [new.label, new.fmt(new.value), old.fmt(old.value), _delta(new, old)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) if len(rows) > 2 else ""


def _delta(new: Figure, old: Figure) -> str:
    """'▲ +1.20M (+10.0%)', '▼ −512 (−50.0%)', 'no change' or 'n/a'."""
    if new.value is None or old.value is None:
        return "n/a"
    diff = new.value - old.value
    if diff == 0:
        return "no change"
    arrow, sign = ("▲", "+") if diff > 0 else ("▼", "−")
    size = f"{abs(diff):,}" if new.label.startswith("Largest batch") else new.fmt(abs(diff))
    pct = percent_change(new.value, old.value)
    ratio = "new" if pct is None else f"{pct:+.1f}%".replace("-", "−")
    return f"{arrow} {sign}{size} ({ratio})"


# -- training at scale: the fit plan, per-rank peaks, GPUs needed ---------------------


def _fit(report: Report) -> str:
    plan = report.memory.fit_plan
    if plan is None:
        return ""
    changes = "; ".join(escape_markdown(c.summary) for c in plan.changes) or "no changes"
    return f"**Make it fit:** {escape_markdown(fit_headline(plan))}. Changes: {changes}."


def _distributed(report: Report, baseline: Report | None) -> str:
    """Heaviest-rank peak per plan and the fewest GPUs per strategy and budget, with the
    baseline's beside them (matched by plan and by strategy and budget)."""
    d = report.distributed
    if not d.plans and not d.gpus_needed:
        return ""
    old = baseline.distributed if baseline is not None else None
    old_peaks = {p.spec: p.per_rank_peak_bytes for p in old.plans} if old else {}
    old_host = {p.spec: p.host_bytes for p in old.plans} if old else {}
    old_gpus = {(g.strategy, g.budget_bytes): g.gpus for g in old.gpus_needed} if old else {}
    rows = [(f"Heaviest rank, `{escape_markdown(p.spec)}`", p.per_rank_peak_bytes,
             old_peaks.get(p.spec), format_bytes) for p in d.plans if not p.error]  # fmt: skip
    rows += [(f"Host memory (CPU offload), `{escape_markdown(p.spec)}`", p.host_bytes,
              old_host.get(p.spec), format_bytes) for p in d.plans if p.host_bytes]  # fmt: skip
    rows += [
        (f"GPUs needed, `{escape_markdown(g.strategy)}` on {budget_label(g.budget_bytes)}",
         g.gpus, old_gpus.get((g.strategy, g.budget_bytes)), _gpus)
        for g in d.gpus_needed
    ]  # fmt: skip
    if old is None:
        table = ["| Distributed (per rank) | Value |", "|---|---:|"]
        table += [f"| {label} | {fmt(new)} |" for label, new, _, fmt in rows]
    else:
        table = [
            "| Distributed (per rank) | This report | Baseline | Change |",
            "|---|---:|---:|---:|",
        ]
        table += [f"| {label} | {fmt(new)} | {fmt(was)} | {_count_delta(new, was, fmt)} |"
                  for label, new, was, fmt in rows]  # fmt: skip
    return "\n".join(table)


def _gpus(n: int | None) -> str:
    return f"{n:,}" if n else "no fit"


def _count_delta(new: int | None, old: int | None, fmt: Callable[..., str]) -> str:
    if new is None or old is None:
        return "n/a"
    diff = new - old
    if diff == 0:
        return "no change"
    arrow, sign = ("▲", "+") if diff > 0 else ("▼", "−")
    size = format_bytes(abs(diff)) if fmt is format_bytes else f"{abs(diff):,}"
    pct = percent_change(new, old)
    ratio = "new" if pct is None else f"{pct:+.1f}%".replace("-", "−")
    return f"{arrow} {sign}{size} ({ratio})"


# -- findings, capture, link ------------------------------------------------------------


def _findings(findings: list[Finding]) -> str:
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    if not findings:
        return "**Findings:** none."
    plural = {"error": "errors", "warning": "warnings", "info": "info"}
    head = "**Findings:** " + ", ".join(
        f"{n} {s if n == 1 else plural[s]}" for s, n in counts.items() if n
    )
    serious = [f for f in findings if f.severity == "error"]
    serious += [f for f in findings if f.severity == "warning"]
    lines = [head] + [_finding_line(f) for f in serious[:MAX_FINDINGS]]
    if len(serious) > MAX_FINDINGS:
        lines.append(f"- and {len(serious) - MAX_FINDINGS} more")
    return "\n".join(lines)


def _finding_line(finding: Finding) -> str:
    line = f"- **{finding.severity}** {escape_markdown(finding.rule)}"
    if finding.where:
        line += f" at {escape_markdown(finding.where)}"
    line += f": {escape_markdown(finding.message)}"
    if finding.fix:
        line += f" Fix: {escape_markdown(finding.fix)}"
    return line


def _capture(report: Report) -> str:
    method = report.capture.method
    if method is None and not report.capture.attempts:
        return ""
    text = f"**Capture:** {escape_markdown(method or 'none')}"
    failures = failed_attempts(report)
    if failures:
        text += " (failed: " + "; ".join(escape_markdown(f) for f in failures) + ")"
    mode = "fake tensors" if report.meta.fake else "real tensors"
    return f"{text} · {mode} on {escape_markdown(report.meta.device)}"


def _link(link: str) -> str:
    # Only web links become links; anything else is shown as text (no javascript: URLs).
    if not re.match(r"^(https?://|/)", link):
        return f"Full report: {escape_markdown(link)}"
    return f"[Full report]({quote(link, safe=_URL_SAFE)})"
