"""FSDP when no one-GPU plan fits: the fewest GPUs whose heaviest rank fits with the most
saving settings (every block checkpointed, micro-batch 1 per rank; the distributed
planner's search, each world size run), then the cheapest plan on that many GPUs: fewer
blocks checkpointed, a larger micro-batch per rank, autocast off, each predicted from a
run at those GPUs (`predict.sharded_peak`) and run itself, at most `SHARD_RUNS` runs.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from inspector.distributed.gpus import fewest_gpus
from inspector.fitplan.candidate import Candidate
from inspector.fitplan.knapsack import checkpointing, cover
from inspector.fitplan.predict import Phases, sharded_peak
from inspector.fitplan.trials import Search, divisors, first_fit
from inspector.fitplan.verify import Verified

__all__ = ["sharded", "SHARD_RUNS"]

SHARD_RUNS = 4  # cheaper FSDP candidates run at the fewest GPUs found
_SHARD_LINE = (2, 16)  # the world sizes the FSDP line is drawn through


def sharded(s: Search, autocast_ok: bool) -> tuple[Candidate, Verified] | None:
    """FSDP with the one-GPU changes that cost no risk beyond autocast: the fewest GPUs
    whose heaviest rank fits with every block checkpointed and micro-batch 1 per rank,
    then the cheapest plan on that many GPUs (`_cheaper_at`)."""
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
    s.sharded_predicted = _line_at(runs, count.gpus)
    strongest = (at(count.gpus), runs[count.gpus])
    return _cheaper_at(s, *strongest, autocast_ok) or strongest  # type: ignore[arg-type]


def _cheaper_at(
    s: Search, ref: Candidate, v: Verified, autocast_ok: bool
) -> tuple[Candidate, Verified] | None:
    """At `ref`'s ranks, the cheapest candidate that fits by its run, cheaper than `ref`
    (which fits): fewer blocks checkpointed, a larger micro-batch dividing the per-rank
    batch (fewer accumulation steps), or autocast off; None when none is. Each candidate
    is predicted from the latest run with its gathering dtype (`ref`; under bf16, `ref`
    with float32 gathers, run, since those are not predicted); a fit becomes the run the
    next, cheaper, candidates are predicted from, until `SHARD_RUNS` runs."""
    refs = {ref.autocast: (ref, v)}
    best, limit = (ref, v), len(s.tries) + SHARD_RUNS
    if ref.autocast:  # float32 units gather and reduce at twice the bytes
        off = replace(ref, autocast=False)
        w = s.run(off)
        if w is not None:
            refs[False] = (off, w)
            best = (off, w) if w.peak_bytes <= s.budget else best

    def predict(c: Candidate) -> int:
        r, rv = refs[c.autocast]
        run = rv.phases or Phases(rv.peak_bytes, rv.peak_bytes, 0, None)
        return sharded_peak(s.p, c, r, run, rv.grad_bytes)

    def recover(base: Candidate, short: int) -> Candidate | None:
        """`base` checkpointed for its shortfall; None unless cheaper than the best yet."""
        c = cover(s.p, base, predict(base) + short - s.budget)
        return c if c is not None and c.cost() < best[0].cost() else None

    while len(s.tries) < limit:
        ran = {c for c, _, _ in s.tries}
        found = [c for c in (recover(base, 0) for base in _rank_bases(ref, list(refs)))
                 if c is not None and c not in ran and predict(c) <= s.budget]  # fmt: skip
        cheaper = first_fit(s, found, predict, recover, limit - len(s.tries))
        if cheaper is None:
            break
        best = refs[cheaper[0].autocast] = cheaper
    if best[0] is ref:
        return None
    s.sharded_predicted = next(p for c, p, _ in reversed(s.tries) if c == best[0])
    return best


def _rank_bases(ref: Candidate, autocasts: list[bool]) -> list[Candidate]:
    """`ref` with no checkpointing, each micro-batch dividing its per-rank batch (the
    rest accumulated) and each of `autocasts`."""
    per_rank = (ref.micro_batch or 0) * ref.accumulation
    micro = divisors(per_rank) if ref.micro_batch else [None]
    return [
        replace(
            ref,
            micro_batch=m,
            accumulation=per_rank // m if m else 1,
            autocast=autocast,
            checkpoint=(),
            extra_compute=0.0,
        )  # fmt: skip
        for autocast, m in itertools.product(autocasts, micro)
    ]


def _line_at(runs: dict[int, Verified | None], n: int) -> int | None:
    """The FSDP line through the runs at `_SHARD_LINE` (peak = fixed + sharded / N) at n:
    the sharded plan's prediction."""
    lo, hi = (runs.get(k) for k in _SHARD_LINE)
    if lo is None or hi is None:
        return None
    a, b = _SHARD_LINE
    sharded = (lo.peak_bytes - hi.peak_bytes) / (1 / a - 1 / b)
    return round(hi.peak_bytes - sharded / b + sharded / n)
