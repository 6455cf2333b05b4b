"""The search: every candidate predicted, the cheapest predicted to fit run first.

Candidates are every combination of bf16 autocast, bf16 parameters, a lighter optimizer,
a micro-batch dividing the effective batch and selective checkpointing (on or off), each
with the cheapest full checkpointing (the knapsack) that the prediction says brings it
under the budget. They are run on fake
tensors cheapest first (`candidate.Candidate.cost`); a run over the budget is tried once
more with the checkpointing re-chosen for the shortfall it showed, then the next. Only
when no one-GPU plan fits is FSDP sharding tried (`sharded`: the fewest GPUs, then the
cheapest plan on them). A plan is shown as fitting only when its run fits; otherwise the
closest run is reported, marked as not found.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

from inspector.context import Context
from inspector.fitplan.candidate import LIGHTER_OPTIMIZERS, Candidate
from inspector.fitplan.changes import changes_of
from inspector.fitplan.knapsack import checkpointing, with_checkpoint
from inspector.fitplan.pieces import Pieces, gather
from inspector.fitplan.predict import predict_peak
from inspector.fitplan.sharded import sharded
from inspector.fitplan.trials import Search, divisors, first_fit
from inspector.fitplan.verify import Verified, count_flops
from inspector.memory import scaling
from inspector.memory.analysis import Analysis
from inspector.report import FitPlan, FitTry

__all__ = ["plan_fit", "MAX_RUNS", "candidates"]

MAX_RUNS = 6  # one-GPU candidates run on fake tensors before sharding is tried


def candidates(p: Pieces, batch: int | None, budget: int, autocast_ok: bool) -> list[Candidate]:
    """Every one-GPU candidate predicted to fit, cheapest first."""
    optimizers = [p.optimizer, *LIGHTER_OPTIMIZERS.get(p.optimizer, ())]
    micro = divisors(batch) if (batch and p.batch) else [None]
    selective = (False, True) if p.selective_saving_bytes > 0 else (False,)
    out = []
    for bf16_params in (False, True) if p.float32_params else (False,):
        for autocast in (False, True) if autocast_ok and not bf16_params else (False,):
            for optimizer in optimizers:
                for m, sel in itertools.product(micro, selective):
                    base = Candidate(
                        optimizer=optimizer, micro_batch=m,
                        accumulation=(batch // m) if (batch and m) else 1,
                        autocast=autocast, bf16_params=bf16_params, batchnorm=p.batchnorm,
                        changed_optimizer=optimizer != p.optimizer, selective=sel,
                    )  # fmt: skip
                    c = with_checkpoint(p, base, budget)
                    if c is not None and predict_peak(p, c) <= budget:
                        out.append(c)
    return sorted(out, key=Candidate.cost)


def _strongest(p: Pieces, batch: int | None) -> Candidate:
    """Every one-GPU change at once: the closest a plan gets when none fits."""
    optimizers = [p.optimizer, *LIGHTER_OPTIMIZERS.get(p.optimizer, ())]
    m = 1 if (batch and p.batch) else None
    c = Candidate(
        optimizer=optimizers[-1], micro_batch=m, accumulation=batch if m else 1,
        bf16_params=p.float32_params,  # bf16 parameters compute in bf16: no autocast
        batchnorm=p.batchnorm, changed_optimizer=optimizers[-1] != p.optimizer,
    )  # fmt: skip
    return checkpointing(p, c, {b.path for b in p.blocks})


def _one_gpu(s: Search, autocast_ok: bool) -> tuple[Candidate, Verified] | None:
    def cover(base: Candidate, short: int) -> Candidate | None:
        return with_checkpoint(s.p, base, s.budget, short)

    found = candidates(s.p, s.batch, s.budget, autocast_ok)
    return first_fit(s, found, lambda c: predict_peak(s.p, c), cover, MAX_RUNS - len(s.tries))


def _tries(s: Search) -> list[FitTry]:
    return [
        FitTry(
            summary=c.summary(),
            predicted_peak_bytes=predicted,
            verified_peak_bytes=v.peak_bytes if v else None,
            fits=bool(v and v.peak_bytes <= s.budget),
            error=s.errors.get(i),
        )
        for i, (c, predicted, v) in enumerate(s.tries)
    ]


def plan_fit(ctx: Context, a: Analysis, budget: int, batch: int | None = None) -> FitPlan:
    """The cheapest verified plan under `budget` at effective batch `batch` (None: the
    input's), or the closest one run."""
    start = time.perf_counter()
    _, input_batch = scaling.batch_size_of(ctx.factory, ctx.inputs)
    effective = batch or input_batch
    optimizers = [a.opts.optimizer, *LIGHTER_OPTIMIZERS.get(a.opts.optimizer, ())]
    notes: list[str] = []
    p = gather(ctx, a, optimizers, notes)
    s = Search(ctx, a, p, budget, effective if input_batch else None)
    plan = FitPlan(budget_bytes=budget, batch=s.batch, notes=notes)
    if batch and not input_batch:
        plan.notes.append("the inputs have no batch dimension: --batch is left out")
    autocast_ok = a.opts.autocast is None and p.float32_params
    baseline = Candidate(optimizer=p.optimizer, micro_batch=s.batch, batchnorm=p.batchnorm)
    if s.batch == input_batch:
        plan.baseline_peak_bytes = a.train.peak_bytes
    else:
        v = s.run(baseline)
        plan.baseline_peak_bytes = v.peak_bytes if v else None
    if plan.baseline_peak_bytes is not None and plan.baseline_peak_bytes <= budget:
        found: tuple[Candidate, Verified] | None = (baseline, _as_verified(a, plan, v=None))
    else:
        found = _one_gpu(s, autocast_ok) or sharded(s, autocast_ok)
    if found is None:
        found = _closest(s)
        plan.notes.append("no plan found within these changes: the closest run is shown")
    if found is not None:
        _fill(s, plan, found)
    plan.tried = _tries(s)
    plan.seconds = round(time.perf_counter() - start, 3)
    return plan


def _as_verified(a: Analysis, plan: FitPlan, v: Verified | None) -> Verified:
    peak = plan.baseline_peak_bytes or 0
    return v or Verified(peak, a.train.grad_bytes)


def _closest(s: Search) -> tuple[Candidate, Verified] | None:
    strongest = _strongest(s.p, s.batch)
    if not any(c == strongest for c, _, _ in s.tries):
        s.run(strongest)
    ran = [(v.peak_bytes, i) for i, (_, _, v) in enumerate(s.tries) if v is not None]
    if not ran:
        return None
    c, _, v = s.tries[min(ran)[1]]
    return c, v  # type: ignore[return-value]


def _fill(s: Search, plan: FitPlan, found: tuple[Candidate, Verified]) -> None:
    c, v = found
    plan.found = v.peak_bytes <= s.budget
    plan.micro_batch, plan.accumulation_steps, plan.gpus = c.micro_batch, c.accumulation, c.gpus
    plan.predicted_peak_bytes = predict_peak(s.p, c) if c.gpus == 1 else s.sharded_predicted
    plan.verified_peak_bytes = v.peak_bytes
    plan.predicted_extra_compute = round(c.extra_compute, 4)
    plan.extra_compute, plan.recompute_flops = 0.0, 0
    if c.checkpoint:
        flops, recompute = count_flops(s.ctx, s.a, replace(c, gpus=1))
        plan.extra_compute = round(recompute / max(flops - recompute, 1), 4)
        plan.recompute_flops = recompute * c.accumulation
    plan.changes = changes_of(c, s.p, plan.extra_compute if c.checkpoint else None)
    per_step = (c.micro_batch or 0) * c.accumulation * c.gpus
    if s.batch and per_step and per_step != s.batch:  # ranks x micro-batch overshoot B
        plan.notes.append(
            f"{c.gpus} ranks x micro-batch {c.micro_batch} x {c.accumulation} make an "
            f"effective batch of {per_step}, not {s.batch}"
        )
