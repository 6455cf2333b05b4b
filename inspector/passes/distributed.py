"""Distributed pass: per-rank training memory for each `--parallel` plan, and the fewest
GPUs of each accelerator size that fit each strategy. See `inspector.distributed`.

Runs after the memory pass and builds on its analysis (the one-rank step at the input's
batch, which is one rank's micro-batch).
"""

from __future__ import annotations

import time

from inspector.context import Context
from inspector.distributed.rankmemory import RankMemory
from inspector.distributed.search import PlanRuns, gpus_needed
from inspector.memory import scaling
from inspector.report import Distributed, GpusNeeded, ParallelPlan
from inspector.schema.parallel import PlanSpec, parse_plan
from inspector.units import ACCELERATOR_BUDGETS

__all__ = ["run"]


def run(ctx: Context) -> None:
    if not ctx.options.parallel:
        return
    start = time.perf_counter()
    section = ctx.report.distributed
    a = ctx.results.memory
    specs = [parse_plan(text) for text in ctx.options.parallel]
    if a is None:
        section.notes.append("no per-rank figures: the memory analysis did not run")
        section.plans = [_failed(s, "the memory analysis did not run") for s in specs]
        return
    _, section.batch_per_rank = scaling.batch_size_of(ctx.factory, ctx.inputs)
    budgets = sorted(set(ACCELERATOR_BUDGETS) | set(ctx.options.budgets_bytes))
    runs = PlanRuns(ctx.model, a)
    section.plans = [_plan(runs, s, budgets) for s in specs]
    for spec in _strategies([s for s, p in zip(specs, section.plans, strict=True) if not p.error]):
        _gpus(runs, section, spec, budgets)
    section.seconds = round(time.perf_counter() - start, 3)


def _plan(runs: PlanRuns, spec: PlanSpec, budgets: list[int]) -> ParallelPlan:
    try:
        m = runs(spec)
    except Exception as exc:  # one plan failing keeps the others
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return _failed(spec, f"{type(exc).__name__}: {first}")
    return _row(spec, m, budgets)


def _row(spec: PlanSpec, m: RankMemory, budgets: list[int]) -> ParallelPlan:
    return ParallelPlan(
        strategy=spec.strategy,
        spec=spec.text,
        world_size=spec.world_size,
        per_rank_peak_bytes=m.peak_bytes,
        heaviest_rank=m.rank,
        peak_phase=m.peak_phase,
        peak_where=m.peak_label,
        param_bytes=m.param_bytes,
        grad_bytes=m.grad_bytes,
        optimizer_bytes=m.optimizer_bytes,
        input_bytes=m.input_bytes,
        saved_activation_bytes=m.saved_activation_bytes,
        comm_bytes=m.comm_bytes,
        units=m.units,
        host_bytes=m.host_bytes if spec.options.get("offload") else None,
        fits={str(b): m.peak_bytes <= b for b in budgets},
        notes=list(m.notes),
    )


def _failed(spec: PlanSpec, why: str) -> ParallelPlan:
    return ParallelPlan(
        strategy=spec.strategy, spec=spec.text, world_size=spec.world_size, error=why
    )


def _strategies(specs: list[PlanSpec]) -> list[PlanSpec]:
    """Each strategy with its options once, whatever world sizes were asked."""
    seen: dict[str, PlanSpec] = {}
    for s in specs:
        seen.setdefault(_name(s), s)
    return list(seen.values())


def _name(spec: PlanSpec) -> str:
    return spec.family


def _gpus(runs: PlanRuns, section: Distributed, spec: PlanSpec, budgets: list[int]) -> None:
    try:
        counts = gpus_needed(runs, spec, budgets)
    except Exception as exc:
        section.notes.append(f"GPUs needed for {_name(spec)}: {type(exc).__name__}: {exc}")
        return
    section.gpus_needed += [
        GpusNeeded(
            strategy=_name(spec),
            budget_bytes=c.budget_bytes,
            gpus=c.gpus,
            per_rank_peak_bytes=c.per_rank_peak_bytes,
        )
        for c in counts
    ]
