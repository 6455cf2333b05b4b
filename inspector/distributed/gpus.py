"""The fewest ranks whose heaviest rank fits an accelerator, per strategy, verified.

DDP replicates everything: its per-rank peak does not depend on the world size, so a
model fits one GPU of a size or none. FSDP's heaviest rank holds 1/N of the parameters,
gradients and optimizer state (padded to whole rows) plus what does not shard (the
activations, a unit's gathered parameters): peak(N) = fixed + sharded / N. Two runs give
the line; the smallest N under each budget is then run itself on fake tensors, and so
is N - 1, so the answer is the fewest that fit by measurement, not by the line.
Tensor parallelism splits heads, so its degrees are few (`TP_SIZES`): each is run in turn
until every budget is met or the heads no longer divide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inspector.schema.parallel import MAX_WORLD_SIZE

__all__ = ["GpuCount", "fewest_gpus", "fewest_tp", "LINE_SIZES", "TP_SIZES"]

LINE_SIZES = (8, 64)  # the two world sizes the FSDP line is drawn through
TP_SIZES = (1, 2, 4, 8, 16, 32, 64)  # TP degrees tried: heads split in powers of two
_TRIES = 4  # ranks added past the line's answer before giving up


@dataclass(frozen=True)
class GpuCount:
    budget_bytes: int
    gpus: int | None  # None: does not fit at any world size
    per_rank_peak_bytes: int | None  # measured at `gpus`


def fewest_gpus(
    peak_at: Callable[[int], int],
    budgets: list[int],
    sharded: bool,
    line: tuple[int, int] = LINE_SIZES,
) -> list[GpuCount]:
    """`peak_at(n)`: the heaviest rank's peak at world size n (runs are cached); `line`:
    the two world sizes the FSDP line goes through."""
    runs: dict[int, int] = {}

    def peak(n: int) -> int:
        if n not in runs:
            runs[n] = peak_at(n)
        return runs[n]

    if not sharded:
        return [GpuCount(b, 1 if peak(1) <= b else None, peak(1)) for b in budgets]
    lo, hi = line
    per_rank = (peak(lo) - peak(hi)) / (1 / lo - 1 / hi)  # sharded bytes, all ranks
    fixed = peak(hi) - per_rank / hi
    if per_rank <= 0:  # more ranks do not help (e.g. 8 experts on dim 0 of 64 ranks)
        return [_fewer_than(peak, b, lo) for b in budgets]
    return [_smallest(peak, b, fixed, per_rank) for b in budgets]


def _fewer_than(peak: Callable[[int], int], budget: int, n: int) -> GpuCount:
    """The heaviest rank grows past `n` ranks: the answer is at most n, or none."""
    if peak(n) > budget:
        return GpuCount(budget, None, None)
    while n > 1 and peak(n - 1) <= budget:
        n -= 1
    return GpuCount(budget, n, peak(n))


def _smallest(peak: Callable[[int], int], budget: int, fixed: float, sharded: float) -> GpuCount:
    if budget <= fixed:
        return GpuCount(budget, None, None)
    n = max(1, min(MAX_WORLD_SIZE, -int(-sharded // (budget - fixed))))
    for _ in range(_TRIES):  # the line is a guide: the runs decide
        if peak(n) <= budget:
            while n > 1 and peak(n - 1) <= budget:
                n -= 1
            return GpuCount(budget, n, peak(n))
        n += 1
    return _doubling(peak, budget, n - 1)


def _doubling(peak: Callable[[int], int], budget: int, over: int) -> GpuCount:
    """The line promised too much (what does not shard grows with N, e.g. a gathered
    unit's padding): double from `over` (too few) until a size fits, then bisect."""
    n = over
    while peak(n) > budget:
        if n >= MAX_WORLD_SIZE:
            return GpuCount(budget, None, None)
        over, n = n, min(2 * n, MAX_WORLD_SIZE)
    while n - over > 1:
        mid = (n + over) // 2
        over, n = (over, mid) if peak(mid) <= budget else (mid, n)
    return GpuCount(budget, n, peak(n))


def fewest_tp(
    peak_at: Callable[[int], int], budgets: list[int], sizes: tuple[int, ...] = TP_SIZES
) -> list[GpuCount]:
    """The smallest TP degree of `sizes` under each budget; a degree whose plan is refused
    (heads that do not divide) ends the search."""
    from inspector.distributed.tpplan import NoTensorParallelPlan

    found: dict[int, GpuCount] = {}
    for n in sizes:
        if len(found) == len(budgets):
            break
        try:
            peak = peak_at(n)
        except NoTensorParallelPlan:
            break
        for b in budgets:
            if b not in found and peak <= b:
                found[b] = GpuCount(b, n, peak)
    return [found.get(b, GpuCount(b, None, None)) for b in budgets]
