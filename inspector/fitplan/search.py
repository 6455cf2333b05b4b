"""The search: every candidate predicted, the cheapest predicted to fit run first.

Candidates are every combination of bf16 autocast, bf16 parameters, a lighter optimizer,
a micro-batch dividing the effective batch and selective checkpointing (on or off), each
with the cheapest full checkpointing (the knapsack) that the prediction says brings it
under the budget. They are run on fake
tensors cheapest first (`candidate.Candidate.cost`); a run over the budget is tried once
more with the checkpointing re-chosen for the shortfall it showed, then the next. Only
when no one-GPU plan fits is FSDP sharding tried, with the fewest GPUs that fit (the
distributed planner's search, each world size run). A plan is shown as fitting only when
its run fits; otherwise the closest run is reported, marked as not found.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field, replace

from inspector.context import Context
from inspector.distributed.gpus import fewest_gpus
from inspector.fitplan.candidate import LIGHTER_OPTIMIZERS, Candidate
from inspector.fitplan.changes import changes_of
from inspector.fitplan.knapsack import cheapest_cover
from inspector.fitplan.pieces import Pieces, gather
from inspector.fitplan.predict import (
    activation_scale,
    fb_without_checkpoint,
    optimizer_peak,
    predict_peak,
    selective_share,
)
from inspector.fitplan.verify import Verified, count_flops, verify, verify_sharded
from inspector.memory import scaling
from inspector.memory.analysis import Analysis
from inspector.report import FitPlan, FitTry

__all__ = ["plan_fit", "MAX_RUNS", "candidates", "checkpointing"]

MAX_RUNS = 6  # one-GPU candidates run on fake tensors before sharding is tried
_SHARD_LINE = (2, 16)  # the world sizes the FSDP line is drawn through


@dataclass
class _Search:
    ctx: Context
    a: Analysis
    p: Pieces
    budget: int
    batch: int | None  # effective batch
    tries: list[tuple[Candidate, int | None, Verified | None]] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)  # try index -> why its run failed
    line_peak: int | None = None  # the sharded plan's predicted peak, by the FSDP line

    def run(self, c: Candidate) -> Verified | None:
        """Run `c` on fake tensors and record the try (None: the run failed)."""
        predicted = predict_peak(self.p, c) if c.gpus == 1 else None  # sharded: by the line
        try:
            v = verify_sharded(self.ctx, self.a, c) if c.gpus > 1 else verify(self.ctx, self.a, c)
        except Exception as exc:  # a failed run is no fit; the search goes on
            self.errors[len(self.tries)] = f"{type(exc).__name__}: {_first_line(exc)}"
            v = None
        self.tries.append((c, predicted, v))
        return v


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _divisors(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def _with_checkpoint(p: Pieces, c: Candidate, budget: int, extra: int = 0) -> Candidate | None:
    """`c` with the cheapest blocks to checkpoint for its predicted peak to fit (`extra`:
    bytes more to free, a run's shortfall); None when no checkpointing can."""
    if optimizer_peak(p, c) > budget:
        return None
    need = fb_without_checkpoint(p, c) + extra - budget
    share = selective_share(p, c) if c.selective else 0.0
    if c.selective:  # every block selective first; a block fully checkpointed loses it
        need -= share * len(p.block_paths)
    if need <= 0:
        return c
    scale = activation_scale(p, c)
    items = [(max(0, round(b.saving_bytes * scale - share)), b.flops) for b in p.blocks]
    if not items:
        return None
    # the largest block's activations come back while it is recomputed
    largest = max(b.saving_bytes for b in p.blocks) * scale
    chosen = cheapest_cover(items, round(need + largest))
    if chosen is None:
        return None
    return checkpointing(p, c, {p.blocks[i].path for i in chosen})


def checkpointing(p: Pieces, c: Candidate, paths: set[str]) -> Candidate:
    """`c` with the blocks at `paths` checkpointed (in model order) and the predicted
    extra compute: their forward FLOPs over the step's forward + backward FLOPs."""
    chosen = [b for b in p.blocks if b.path in paths]
    flops = sum(b.flops for b in chosen)
    extra = flops / p.step_flops if p.step_flops else 0.0
    return replace(c, checkpoint=tuple(b.path for b in chosen), extra_compute=extra)


def candidates(p: Pieces, batch: int | None, budget: int, autocast_ok: bool) -> list[Candidate]:
    """Every one-GPU candidate predicted to fit, cheapest first."""
    optimizers = [p.optimizer, *LIGHTER_OPTIMIZERS.get(p.optimizer, ())]
    micro = _divisors(batch) if (batch and p.batch) else [None]
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
                    c = _with_checkpoint(p, base, budget)
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


def _one_gpu(s: _Search, autocast_ok: bool) -> tuple[Candidate, Verified] | None:
    found = candidates(s.p, s.batch, s.budget, autocast_ok)
    queue = [(c.cost(), i, c) for i, c in enumerate(found)]
    heapq.heapify(queue)
    retried: set[Candidate] = set()
    order = len(queue)
    while queue and len(s.tries) < MAX_RUNS:
        _, _, c = heapq.heappop(queue)
        v = s.run(c)
        if v is None:
            continue
        if v.peak_bytes <= s.budget:
            return c, v
        if c in retried:
            continue
        # the prediction was short by this much: choose the checkpointing again for it
        base = replace(c, checkpoint=(), extra_compute=0.0)
        again = _with_checkpoint(s.p, base, s.budget, v.peak_bytes - predict_peak(s.p, c))
        if again is not None and again.checkpoint != c.checkpoint:
            retried.add(again)
            order += 1
            heapq.heappush(queue, (again.cost(), order, again))
    return None


def _sharded(s: _Search, autocast_ok: bool) -> tuple[Candidate, Verified] | None:
    """FSDP with the one-GPU changes that cost no risk beyond autocast: every block
    checkpointed, micro-batch 1 per rank; the fewest GPUs whose heaviest rank fits."""
    if not s.a.on_fake:
        return None
    m = 1 if (s.batch and s.p.batch) else None

    def at(n: int) -> Candidate:
        steps = max(1, -(-(s.batch or 1) // n)) if m else 1
        c = Candidate(
            optimizer=s.p.optimizer, micro_batch=m, accumulation=steps,
            autocast=autocast_ok, gpus=n, batchnorm=s.p.batchnorm,
        )  # fmt: skip
        return checkpointing(s.p, c, {b.path for b in s.p.blocks})

    runs: dict[int, Verified | None] = {}

    def peak_at(n: int) -> int:
        if n not in runs:
            runs[n] = s.run(at(n))
        v = runs[n]
        if v is None:
            raise RuntimeError(f"the FSDP run on {n} ranks failed")
        return v.peak_bytes

    try:
        count = fewest_gpus(peak_at, [s.budget], sharded=True, line=_SHARD_LINE)[0]
    except Exception:  # a failed FSDP run: no sharded plan (its try says why)
        return None
    if count.gpus is None or count.gpus < 2 or runs.get(count.gpus) is None:
        return None
    s.line_peak = _line_at(runs, count.gpus)
    return at(count.gpus), runs[count.gpus]  # type: ignore[return-value]


def _line_at(runs: dict[int, Verified | None], n: int) -> int | None:
    """The FSDP line through the runs at `_SHARD_LINE` (peak = fixed + sharded / N) at n:
    the sharded plan's prediction."""
    lo, hi = (runs.get(k) for k in _SHARD_LINE)
    if lo is None or hi is None:
        return None
    a, b = _SHARD_LINE
    sharded = (lo.peak_bytes - hi.peak_bytes) / (1 / a - 1 / b)
    return round(hi.peak_bytes - sharded / b + sharded / n)


def _tries(s: _Search) -> list[FitTry]:
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
    s = _Search(ctx, a, p, budget, effective if input_batch else None)
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
        found = _one_gpu(s, autocast_ok) or _sharded(s, autocast_ok)
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


def _closest(s: _Search) -> tuple[Candidate, Verified] | None:
    strongest = _strongest(s.p, s.batch)
    if not any(c == strongest for c, _, _ in s.tries):
        s.run(strongest)
    ran = [(v.peak_bytes, i) for i, (_, _, v) in enumerate(s.tries) if v is not None]
    if not ran:
        return None
    c, _, v = s.tries[min(ran)[1]]
    return c, v  # type: ignore[return-value]


def _fill(s: _Search, plan: FitPlan, found: tuple[Candidate, Verified]) -> None:
    c, v = found
    plan.found = v.peak_bytes <= s.budget
    plan.micro_batch, plan.accumulation_steps, plan.gpus = c.micro_batch, c.accumulation, c.gpus
    plan.predicted_peak_bytes = predict_peak(s.p, c) if c.gpus == 1 else s.line_peak
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
