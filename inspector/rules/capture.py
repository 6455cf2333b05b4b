"""Rules on graph capture (the `capture` section) and on what fake mode leaves out."""

from __future__ import annotations

from collections.abc import Iterator

from inspector.context import Context
from inspector.report import Finding, Report
from inspector.rules.registry import finding, rule

_FIX = {
    "fx": "fx cannot trace data-dependent control flow or non-torch calls; "
    "torch.fx.wrap them or use torch.export, which the inspector tries next.",
    "export": "Data-dependent branches need torch.cond; see the torch.export error above.",
    "hooks": "Only module-level hooks were possible; per-op details are missing.",
}


@rule("capture-failed", "warning")
def capture_failed(ctx: Context, report: Report) -> Iterator[Finding]:
    """A capture method failed; info when a later method succeeded."""
    attempts = report.capture.attempts
    for i, attempt in enumerate(attempts):
        if attempt.ok:
            continue
        rescued = any(a.ok for a in attempts[i + 1 :])
        at = f" at {attempt.location}" if attempt.location else ""
        line = f" (`{attempt.source_line}`)" if attempt.source_line else ""
        yield finding(
            "capture-failed",
            attempt.location or "",
            f"{attempt.method} capture failed{at}{line}: {attempt.error_type or 'error'}: "
            f"{attempt.error}"
            + (f"; {report.capture.method} was used instead." if rescued else ""),
            _FIX.get(attempt.method, ""),
            severity="info" if rescued else "warning",
        )


@rule("values-not-computed", "info")
def values_not_computed(ctx: Context, report: Report) -> Iterator[Finding]:
    """Fake mode: gradients, numerics and train/eval were skipped (structure still ran)."""
    if ctx.options.fake:
        yield finding(
            "values-not-computed",
            "",
            "fake mode: gradient flow, numeric health and train/eval checks need real values "
            "and were skipped; structural rules still ran.",
            "Run without --fake (on a smaller batch if memory is the reason) for these checks.",
        )
