"""The fewest ranks whose heaviest rank fits an accelerator, per strategy, verified.

DDP replicates everything: its per-rank peak does not depend on the world size, so a
model fits one GPU of a size or none. FSDP's heaviest rank holds 1/N of the parameters,
gradients and optimizer state (padded to whole rows) plus what does not shard (the
activations, a unit's gathered parameters): peak(N) = fixed + sharded / N. Two runs give
the line; the smallest N under each budget is then run itself on fake tensors, and so
is N - 1, so the answer is the fewest that fit by measurement, not by the line.
Where ranks differ (uneven shards), the search runs one kind of rank, a lower bound of
the heaviest: its answer N has N - 1 over the budget for every rank, so only N itself
is then run for every kind (`fewest_gpus_checked`).
Tensor parallelism splits heads, so its degrees are few (`TP_SIZES`): each is run in turn
until every budget is met or the heads no longer divide.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from inspector.schema.parallel import MAX_WORLD_SIZE

__all__ = [
    "AtLeast",
    "GpuCount",
    "fewest_gpus",
    "fewest_gpus_checked",
    "fewest_tp",
    "LINE_SIZES",
    "TP_SIZES",
]

LINE_SIZES = (8, 64)  # the two world sizes the FSDP line is drawn through
TP_SIZES = (1, 2, 4, 8, 16, 32, 64)  # TP degrees tried: heads split in powers of two
_SEARCH_RUNS = 8  # guesses along the lines through the runs before bisecting


@dataclass(frozen=True)
class GpuCount:
    budget_bytes: int
    gpus: int | None  # None: does not fit at any world size
    per_rank_peak_bytes: int | None  # measured at `gpus`


class AtLeast(int):
    """A lower bound's figure that stopped at the first kind of rank over the budget it was
    asked about: the heaviest rank is at least this, and over that budget."""


def fewest_gpus(
    peak_at: Callable[..., int],
    budgets: list[int],
    sharded: bool,
    line: tuple[int, int] = LINE_SIZES,
    stops_over: bool = False,
) -> list[GpuCount]:
    """`peak_at(n)`: the heaviest rank's peak at world size n (runs are cached); `line`:
    the two world sizes the FSDP line is drawn through. Every budget's search uses every
    run made so far (one budget's runs narrow the next one's). With `stops_over`,
    `peak_at(n, over)` may stop as soon as it is over `over` and say so (`AtLeast`)."""
    peaks = _Peaks(peak_at, stops_over)
    if not sharded:
        return [GpuCount(b, 1 if peaks.at(1) <= b else None, peaks.at(1)) for b in budgets]
    lo, hi = line
    plo, phi = peaks.at(lo), peaks.at(hi)
    per_rank = (plo - phi) / (1 / lo - 1 / hi)
    fixed = phi - per_rank / hi
    if per_rank <= 0:  # more ranks do not help (e.g. 8 experts on dim 0 of 64 ranks):
        # the answer is at most `lo`, searched below it as any other
        return [_search(peaks, b, lo) if plo <= b else GpuCount(b, None, None) for b in budgets]
    return [_search(peaks, b, _guess(b, fixed, per_rank)) for b in budgets]


class _Peaks:
    """World size -> figure, each run once. An `AtLeast` says "over" for its budget and
    every smaller one, nothing for a larger one: that budget runs it again (the kinds of
    rank already run are cached below)."""

    def __init__(self, peak_at: Callable[..., int], stops_over: bool) -> None:
        self.peak_at, self.stops_over = peak_at, stops_over
        self.runs: dict[int, int] = {}

    def at(self, n: int, budget: int | None = None) -> int:
        known = self.runs.get(n)
        if known is None or not self._tells(known, budget):
            known = self.peak_at(n, budget) if self.stops_over else self.peak_at(n)
            self.runs[n] = known
        return known

    def view(self, budget: int) -> dict[int, int]:
        """The runs that tell of `budget`."""
        return {n: p for n, p in self.runs.items() if self._tells(p, budget)}

    @staticmethod
    def _tells(peak: int, budget: int | None) -> bool:
        return not isinstance(peak, AtLeast) or (budget is not None and peak > budget)


def _search(peaks: _Peaks, budget: int, guess: int | None) -> GpuCount:
    runs = peaks.view(budget)

    def peak(n: int) -> int:
        runs[n] = peaks.at(n, budget)
        return runs[n]

    return _smallest(peak, runs, budget, guess)


def fewest_gpus_checked(
    lower_bound_at: Callable[..., int],
    peak_at: Callable[[int], int],
    budgets: list[int],
    sharded: bool,
    line: tuple[int, int] = LINE_SIZES,
    widen: Callable[[int], bool] = lambda n: False,
    stops_over: bool = False,
) -> list[GpuCount]:
    """`fewest_gpus` searched with `lower_bound_at(n) <= peak_at(n)` (some kinds of rank,
    cheaper to run than every kind), then checked with `peak_at`. The search's answer n
    has a lower bound over the budget at n - 1, so the heaviest rank is over there too.
    Where the heaviest rank at n does not fit, `widen(n)` adds the kind that was heaviest
    there to the lower bound and that budget is searched again; when nothing is left to
    add, it is searched with `peak_at` alone. A budget no world size meets for the lower
    bound is met by none. `stops_over`: `lower_bound_at(n, over)` may stop at a kind over
    `over` (fewest_gpus)."""
    found: dict[int, GpuCount] = {}
    pending = list(budgets)
    while pending:
        retry = []
        for c in fewest_gpus(lower_bound_at, pending, sharded, line, stops_over):
            peak = peak_at(c.gpus) if c.gpus is not None else None
            if peak is None or peak <= c.budget_bytes:
                found[c.budget_bytes] = replace(c, per_rank_peak_bytes=peak)
            elif widen(c.gpus):
                retry.append(c.budget_bytes)
            else:
                found[c.budget_bytes] = fewest_gpus(peak_at, [c.budget_bytes], sharded, line)[0]
        pending = retry
    return [found[b] for b in budgets]


def _guess(budget: int, fixed: float, sharded: float) -> int | None:
    """Where the line fixed + sharded / n meets the budget; None: it never does."""
    return None if budget <= fixed else _clamp(-int(-sharded // (budget - fixed)))


def _smallest(
    peak: Callable[[int], int], runs: dict[int, int], budget: int, guess: int | None
) -> GpuCount:
    """The fewest ranks that fit by measurement: n fits and n - 1 does not. The line's
    guess is run first; while it misses, the next guess is the line through the two runs
    nearest the budget on either side (the runs bracket the answer and the bracket only
    shrinks), so a line that is off by a few percent costs a run or two, not a walk."""
    n = guess
    for _ in range(_SEARCH_RUNS):
        if n is None:
            return GpuCount(budget, None, None)
        if peak(n) <= budget and (n == 1 or (n - 1 in runs and runs[n - 1] > budget)):
            return GpuCount(budget, n, peak(n))
        # a guess that fits is not taken for the answer until the one below it is run:
        # the bracket says whether that is next, or a guess further down
        n = _next_guess(runs, budget)
    return _bisect(peak, runs, budget)


def _next_guess(runs: dict[int, int], budget: int) -> int | None:
    """Where the line through the runs around the budget crosses it; None when even the
    most ranks there are do not fit and more would not help."""
    fit = [n for n, p in runs.items() if p <= budget]
    if not fit:  # all over: extrapolate from the most ranks and a run well below them
        spread = _spread(runs)
        b = spread[-1]
        if b >= MAX_WORLD_SIZE or len(spread) < 2:
            return None if b >= MAX_WORLD_SIZE else _clamp(2 * b)
        a = spread[-2]
        if runs[b] >= runs[a]:  # more ranks made it worse: what grows with N may dip between
            return _dip({n: runs[n] for n in spread[-3:]}, budget)
        guess = _crossing(a, runs[a], b, runs[b], budget) or 2 * b
        # where the peak flattens the line overshoots (Llama-3-70B at 40 GiB: it said 148
        # past 119, the answer is 122): go at most twice as far as the last step went
        guess = min(guess, b + 2 * (b - max(n for n in runs if n < b)))
        # near the last run the padding of uneven shards moves the peak more than the
        # line can say: step a few ranks on there (what fits is then bracketed)
        step = max(2, b // 32)
        return _clamp(b + step if guess <= b + step else guess)
    hi = min(fit)
    over = [n for n, p in runs.items() if p > budget and n < hi]
    if not over:  # all fit: extrapolate down from the two runs with the fewest ranks
        a, b = sorted(runs)[:2]
        guess = _crossing(a, runs[a], b, runs[b], budget) or 1
        return max(1, min(hi - 1, guess))
    lo = max(over)
    if hi - lo == 1:
        return hi  # bracketed: hi fits and hi - 1 does not
    guess = _crossing(lo, runs[lo], hi, runs[hi], budget) or hi
    # where the peak is flat in n the line's crossing sits next to an end of the bracket
    # and would walk it one rank a run: keep it a third of the bracket from either end,
    # and halve a short bracket, where whole-row padding moves the peak more than n does
    if hi - lo <= 8:
        return (lo + hi) // 2
    margin = (hi - lo) // 3
    return min(hi - margin, max(lo + margin, guess))


def _spread(runs: dict[int, int]) -> list[int]:
    """The world sizes run, from the most down, each at most 2/3 of the one after it (in
    increasing order): points far enough apart that padding does not swamp their line."""
    picked: list[int] = []
    for n in sorted(runs, reverse=True):
        if not picked or n * 3 <= picked[-1] * 2:
            picked.append(n)
    return picked[::-1]


def _dip(runs: dict[int, int], budget: int) -> int | None:
    """peak = F + S / n + d * n through three runs (something that does not shard grows
    with n): the smallest n under the budget if its minimum is, else None (no world size
    fits)."""
    if len(runs) < 3:
        return None
    points = sorted(runs.items())[-3:]
    (x1, y1), (x2, y2), (x3, y3) = points
    # y = F + S u + d x with u = 1 / x: solve the 3 x 3 system by elimination
    u1, u2, u3 = 1 / x1, 1 / x2, 1 / x3
    det = (u2 - u1) * (x3 - x1) - (u3 - u1) * (x2 - x1)
    if det == 0:
        return None
    s = ((y2 - y1) * (x3 - x1) - (y3 - y1) * (x2 - x1)) / det
    d = ((u2 - u1) * (y3 - y1) - (u3 - u1) * (y2 - y1)) / det
    f = y1 - s * u1 - d * x1
    if s <= 0 or d <= 0 or f + 2 * math.sqrt(s * d) > budget:
        return None
    room = budget - f  # d n^2 - room n + s <= 0 between the roots: the smaller one
    n = _clamp(math.ceil((room - math.sqrt(room * room - 4 * d * s)) / (2 * d)))
    return None if n in runs and runs[n] > budget else n


def _crossing(a: int, pa: int, b: int, pb: int, budget: int) -> int | None:
    """The smallest n >= 1 with fixed + sharded / n <= budget on the line through (a, pa)
    and (b, pb) in 1/n; None when that line never comes under the budget."""
    if a == b:
        return None
    sharded = (pa - pb) / (1 / a - 1 / b)
    return _guess(budget, pb - sharded / b, sharded) if sharded > 0 else None


def _bisect(peak: Callable[[int], int], runs: dict[int, int], budget: int) -> GpuCount:
    """The guarantee behind the guesses: bisect the bracket the runs give (doubling past
    the most ranks run until one fits)."""
    n = max(runs)
    over = max((k for k, p in runs.items() if p > budget), default=0)
    fit = [k for k, p in runs.items() if p <= budget and k > over]
    hi = min(fit) if fit else None
    while hi is None:
        if n >= MAX_WORLD_SIZE:
            return GpuCount(budget, None, None)
        n = _clamp(2 * n)
        if peak(n) <= budget:
            hi = n
        else:
            over = n
    while hi - over > 1:
        mid = (hi + over) // 2
        over, hi = (over, mid) if peak(mid) <= budget else (mid, hi)
    return GpuCount(budget, hi, peak(hi))


def _clamp(n: int) -> int:
    return max(1, min(MAX_WORLD_SIZE, n))


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
