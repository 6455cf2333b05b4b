"""Fit pass (`--fit BUDGET [--batch B]`): the cheapest verified changes that bring the
training-step peak under the budget -> `memory.fit_plan`. See `inspector.fitplan`.

Runs after the memory pass and builds on its analysis; every plan it shows ran on fake
tensors.
"""

from __future__ import annotations

from inspector.context import Context
from inspector.fitplan.search import plan_fit
from inspector.report import FitPlan

__all__ = ["run", "wanted"]


def wanted(ctx: Context) -> bool:
    return ctx.options.fit_bytes is not None


def run(ctx: Context) -> None:
    budget = ctx.options.fit_bytes
    if budget is None:
        return
    a = ctx.results.memory
    if a is None or not a.on_fake:
        why = (
            "the memory analysis did not run"
            if a is None
            else "the model only runs on real tensors"
        )
        ctx.report.memory.fit_plan = FitPlan(
            budget_bytes=budget, batch=ctx.options.fit_batch,
            notes=[f"no fit plan: {why}, and plans are verified on fake tensors"],
        )  # fmt: skip
        return
    try:
        ctx.report.memory.fit_plan = plan_fit(ctx, a, budget, ctx.options.fit_batch)
    except Exception as exc:  # the report keeps everything else
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        ctx.report.memory.fit_plan = FitPlan(
            budget_bytes=budget, batch=ctx.options.fit_batch,
            notes=[f"no fit plan: the search failed ({type(exc).__name__}: {first})"],
        )  # fmt: skip
