"""Distributed pass: per-rank training memory for each `--parallel` plan, and the fewest
GPUs of each accelerator size that fit each strategy. See `inspector.distributed`.

Runs after the memory pass and builds on its analysis (the one-rank step at the input's
batch, which is one rank's micro-batch).
"""

from __future__ import annotations

import time

from inspector.context import Context
from inspector.distributed.gpus import LINE_SIZES, fewest_gpus_checked, fewest_tp
from inspector.distributed.plan import rank_kinds, rank_memories, rank_memory
from inspector.distributed.rankmemory import RankMemory
from inspector.memory import scaling
from inspector.memory.analysis import Analysis
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
    runs = _Runs(ctx, a)
    section.plans = [_plan(runs, s, budgets) for s in specs]
    for spec in _strategies([s for s, p in zip(specs, section.plans, strict=True) if not p.error]):
        _gpus(runs, section, spec, budgets)
    section.seconds = round(time.perf_counter() - start, 3)


class _Runs:
    """Each plan run once, each kind of rank of it once: the GPUs-needed search reuses the
    asked plans' runs, and its verification reuses the kind of rank it searched with."""

    def __init__(self, ctx: Context, a: Analysis) -> None:
        self.ctx, self.a = ctx, a
        self.done: dict[str, RankMemory] = {}
        self.ranks: dict[tuple[str, int], RankMemory] = {}
        self.kinds: dict[str, set[int]] = {}  # a family's kinds of rank in its lower bound

    def __call__(self, spec: PlanSpec) -> RankMemory:
        """The heaviest rank of `spec`."""
        if spec.text not in self.done:
            if spec.strategy in ("fsdp", "fsdp+tp", "tp"):
                kinds = self._ranks(spec, rank_kinds(spec, self.ctx.model))
                self.done[spec.text] = max(kinds, key=lambda m: m.peak_bytes)
            else:
                self.done[spec.text] = rank_memory(spec, self.ctx.model, self.a)
        return self.done[spec.text]

    def lower_bound(self, spec: PlanSpec) -> RankMemory:
        """The heaviest of some kinds of rank of `spec`, never above `self(spec)`: the
        first and the last kind (full chunks; the short ones) and those `widen` added."""
        kinds = rank_kinds(spec, self.ctx.model)
        if len(kinds) == 1:
            return self(spec)
        positions = {p % len(kinds) for p in self.kinds.get(spec.family, {0, -1})}
        ranks = sorted(kinds[p] for p in positions if p < len(kinds))
        return max(self._ranks(spec, ranks), key=lambda m: m.peak_bytes)

    def widen(self, spec: PlanSpec) -> bool:
        """Add the position of the kind heaviest under `spec` to its family's lower bound;
        False when it is there already."""
        kinds = rank_kinds(spec, self.ctx.model)
        heaviest = kinds.index(self(spec).rank)
        chosen = self.kinds.setdefault(spec.family, {0, -1})
        if heaviest in {p % len(kinds) for p in chosen}:
            return False
        chosen.add(heaviest)
        return True

    def _ranks(self, spec: PlanSpec, ranks: list[int]) -> list[RankMemory]:
        missing = [r for r in ranks if (spec.text, r) not in self.ranks]
        if missing:
            got = rank_memories(spec, self.ctx.model, self.a, missing)
            self.ranks.update({(spec.text, r): m for r, m in got.items()})
        return [self.ranks[spec.text, r] for r in ranks]


def _plan(runs: _Runs, spec: PlanSpec, budgets: list[int]) -> ParallelPlan:
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


def _gpus(runs: _Runs, section: Distributed, spec: PlanSpec, budgets: list[int]) -> None:
    # a 2-D plan keeps its TP degree: the search varies the FSDP degree, in TP groups
    group = spec.tp_size if spec.strategy == "fsdp+tp" else 1

    def peak_at(n: int) -> int:
        return runs(spec.with_world_size(n * group)).peak_bytes

    def lower_bound_at(n: int) -> int:
        return runs.lower_bound(spec.with_world_size(n * group)).peak_bytes

    def widen(n: int) -> bool:
        return runs.widen(spec.with_world_size(n * group))

    try:
        if spec.strategy == "tp":
            counts = fewest_tp(peak_at, budgets)
        else:  # through the asked degree (already run) and 8 times it
            dp = spec.world_size // group
            line = (dp, 8 * dp) if dp > 1 else LINE_SIZES
            sharded = spec.strategy != "ddp"
            counts = fewest_gpus_checked(lower_bound_at, peak_at, budgets, sharded, line, widen)
    except Exception as exc:
        section.notes.append(f"GPUs needed for {_name(spec)}: {type(exc).__name__}: {exc}")
        return
    section.gpus_needed += [
        GpusNeeded(
            strategy=_name(spec),
            budget_bytes=c.budget_bytes,
            gpus=c.gpus * group if c.gpus else None,
            per_rank_peak_bytes=c.per_rank_peak_bytes,
        )
        for c in counts
    ]
