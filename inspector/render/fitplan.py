"""The terminal view of `memory.fit_plan`: the changes with their cost and code, then the
predicted and verified peaks. Reads the Report only."""

from __future__ import annotations

from rich.console import Group
from rich.syntax import Syntax
from rich.text import Text

from inspector.render.format import fit_headline
from inspector.report import FitPlan, Report
from inspector.units import format_flops

__all__ = ["fit_section"]


def _compute(plan: FitPlan) -> str:
    if not plan.recompute_flops:
        return "no extra compute"
    return (
        f"extra compute {100 * (plan.extra_compute or 0):.1f}% "
        f"({format_flops(plan.recompute_flops)} recomputed per step; predicted "
        f"{100 * (plan.predicted_extra_compute or 0):.1f}%)"
    )


def fit_section(report: Report) -> Group | None:
    plan = report.memory.fit_plan
    if plan is None:
        return None
    style = "green" if plan.found else "yellow"
    parts: list[Text | Syntax] = [
        Text("\nMake it fit", style="bold"),
        Text(fit_headline(plan), style=style),
    ]
    if plan.verified_peak_bytes is not None:
        batch = f"effective batch {plan.batch}, " if plan.batch else ""
        parts.append(Text(f"{batch}{_compute(plan)}", style="dim"))
    if plan.verified_peak_bytes is not None and not plan.changes:
        parts.append(Text("no changes needed", style="dim"))
    for i, change in enumerate(plan.changes, 1):
        parts.append(Text(f"{i}. {change.summary}", style="bold"))
        parts.append(Text(f"   cost: {change.cost}", style="dim"))
        parts.append(Syntax(change.snippet, "python", theme="ansi_dark", padding=(0, 3)))
    parts += [Text(note, style="dim") for note in plan.notes]
    return Group(*parts)
