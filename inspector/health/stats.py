"""Value statistics of one tensor: range, zeros, NaN/Inf, dead ReLU features, saturated
sigmoid/tanh, float16 overflow and bfloat16 precision loss.

A report runs this on every node's output, so the work goes through the values in
slices (inspector/health/slices.py; `x.double()` of a [4, 512, 3072] tensor alone takes
about 28 ms). The mean and standard deviation are summed in float64 slice by slice, as
the float64 copy of the whole tensor did before.
"""

from __future__ import annotations

import math

import torch

from inspector.health.slices import SLICE, Slices
from inspector.report import NumericStats

__all__ = [
    "tensor_stats",
    "float64_norm",
    "nonzero_and_norm",
    "DEAD_MIN_SAMPLES",
    "FP16_MAX",
    "FP16_MIN_NORMAL",
    "MASK_ABS",
]

# the default of thresholds.DEFAULTS['dead_min_samples'] (why: there)
DEAD_MIN_SAMPLES = 32
FP16_MAX = 65504.0
FP16_MIN_NORMAL = 6.103515625e-05  # 2**-14; below it float16 is subnormal, then zero
# Masks built with torch.finfo(dtype).min are chosen per dtype (HF does so): not overflow.
MASK_ABS = 1e38
_SATURATION = 1e-3


def tensor_stats(
    t: torch.Tensor, kind: str = "", min_samples: int = DEAD_MIN_SAMPLES
) -> NumericStats:
    x = t.detach()
    x = x.abs() if x.is_complex() else x
    x = x if x.dtype == torch.float64 else x.float()
    stats = NumericStats()
    if not x.numel():
        return stats
    if not _one_pass(stats, x):  # NaN, Inf or mask constants: the passes that drop them
        _dropping_passes(stats, x)
    if kind == "relu":
        stats.dead_fraction = dead_fraction(x, min_samples)
    elif kind in ("sigmoid", "tanh"):
        finite = stats.nan_count == 0 and stats.inf_count == 0
        stats.saturated_fraction = _saturated(x if finite else x[torch.isfinite(x)], kind)
    return stats


def _one_pass(stats: NumericStats, x: torch.Tensor) -> bool:
    """Every statistic but the per-feature ones in one pass over the slices, each slice
    read from memory once (a ReLU's [8, 64, 112, 112] output: 33 ms in four passes, 22 in
    one). The slices' means and centred squares, summed in float64, are combined as
    Chan et al. do (the two-pass figures to 2e-16). False, with `stats` untouched, where a
    value is NaN, Inf or a mask constant: they must be counted and dropped first."""
    slices = Slices(x)
    rounded = torch.empty(slices.size, dtype=torch.bfloat16)
    n, mean, squares, rounding = 0, 0.0, 0.0, 0.0
    nonzero, below, overflow = 0, 0, 0
    low, high = math.inf, -math.inf
    for part in slices:
        k = part.numel()
        part_low, part_high = slices.extremes(part)
        wide = slices.wide(part)  # centred in place below, once the mean is known
        total = slices.total(wide)
        largest = max(-part_low, part_high)
        if not math.isfinite(total) or largest >= MASK_ABS:
            return False
        low, high = min(low, part_low), max(high, part_high)
        nonzero += slices.nonzero(part)
        magnitude = torch.abs(part, out=slices.same(part))
        if largest > FP16_MAX:  # else no value can overflow: no count
            overflow += _count(magnitude > FP16_MAX)
        below += slices.count_below(magnitude, FP16_MIN_NORMAL)
        part_mean = total / k
        centred = slices.centred(wide, part_mean)
        delta, n = part_mean - mean, n + k
        mean += delta * k / n
        squares += slices.squares(centred) + delta * delta * (n - k) * k / n
        error = slices.same(part).copy_(rounded[:k].copy_(part)).sub_(part)  # exact in f32
        rounding += slices.squares(slices.wide(error))
    stats.zero_fraction = 1.0 - nonzero / n
    stats.min, stats.max = low, high
    stats.fp16_overflow_count = overflow
    if nonzero:
        stats.fp16_underflow_fraction = (below - (n - nonzero)) / nonzero
    stats.mean, stats.std = mean, math.sqrt(squares / n)
    if n >= 2 and stats.std != 0:
        stats.bf16_error = math.sqrt(rounding / n) / stats.std
    return True


def _dropping_passes(stats: NumericStats, x: torch.Tensor) -> None:
    """The statistics of a tensor with NaN, Inf or mask constants: counted, then left out
    of the range, mean and spread."""
    slices = Slices(x)
    nonzero, total = 0, 0.0
    for part in slices:
        nonzero += slices.nonzero(part)
        total += slices.total(slices.wide(part))
    stats.zero_fraction = 1.0 - nonzero / x.numel()
    values: torch.Tensor = x
    if not math.isfinite(total):  # rare: count and drop the NaN/Inf
        finite = torch.isfinite(x)
        stats.nan_count = _count(torch.isnan(x))
        stats.inf_count = _count(~finite) - stats.nan_count
        values, total = x[finite], None
        nonzero -= stats.nan_count + stats.inf_count
    _moments(stats, values, nonzero, total)


def _moments(stats: NumericStats, values: torch.Tensor, nonzero: int, total: float | None) -> None:
    """`nonzero`: the nonzero count of `values`, `total` their sum (None: not known), both
    known by the caller."""
    if not values.numel():
        return
    low, high = torch.aminmax(values)
    stats.min, stats.max = low.item(), high.item()
    largest = max(-stats.min, stats.max)
    slices = Slices(values)
    below, overflow = 0, 0
    for part in slices:
        magnitude = torch.abs(part, out=slices.same(part))
        if largest > FP16_MAX:  # else no value can overflow: no count
            overflow += _count((magnitude > FP16_MAX) & (magnitude < MASK_ABS))
        below += slices.count_below(magnitude, FP16_MIN_NORMAL)
    stats.fp16_overflow_count = overflow
    if nonzero:
        zeros = values.numel() - nonzero  # below the normal range and not zero: tiny
        stats.fp16_underflow_fraction = (below - zeros) / nonzero
    if largest >= MASK_ABS:  # mask constants would swamp mean and std
        values, total = values[values.abs() < MASK_ABS], None
    if values.numel():
        stats.mean, stats.std, stats.bf16_error = _spread(values, total)


def _spread(values: torch.Tensor, total: float | None) -> tuple[float, float, float | None]:
    """Mean and standard deviation (two passes, summed in float64), and rms(x - bf16(x)) /
    std(x), None for constants."""
    slices, n = Slices(values), values.numel()
    if total is None:
        total = sum(slices.total(slices.wide(part)) for part in slices)
    mean = total / n
    squares, rounding = 0.0, 0.0
    for part in slices:
        squares += slices.squares(slices.centred(slices.wide(part), mean))
        error = slices.same(part).copy_(part.bfloat16()).sub_(part)  # exact in float32
        rounding += slices.squares(slices.wide(error))
    std = math.sqrt(squares / n)
    if n < 2 or std == 0:
        return mean, std, None
    return mean, std, math.sqrt(rounding / n) / std


def float64_norm(t: torch.Tensor) -> float:
    """The 2-norm, its squares summed in float64 slice by slice: `vector_norm` sums a
    float32 tensor in float32 (38.6 M values, GPT-2's embedding gradient's size: 0.27%
    off), and a float64 copy of the whole tensor costs its pages."""
    return nonzero_and_norm(t, count=False)[1]


def nonzero_and_norm(t: torch.Tensor, count: bool = True) -> tuple[int, float]:
    """(nonzero values, `float64_norm`) in one pass over the slices: `count_nonzero` on
    a float tensor is slower than a mask made slice by slice and counted (a fresh
    [8, 64, 112, 112] gradient: 9.0 ms against 1.2). The count is 0 where not asked."""
    x = t.detach()
    x = x.abs() if x.is_complex() else x
    if not x.numel():
        return 0, 0.0
    slices = Slices(x if x.dtype == torch.float64 else x.float())
    nonzero, squares = 0, 0.0
    for part in slices:
        if count:
            nonzero += slices.nonzero(part)
        squares += slices.squares(slices.wide(part))
    return nonzero, math.sqrt(squares)


def _count(mask: torch.Tensor) -> int:
    """True elements of a bool mask: count_nonzero, not `.sum()`, which widens the mask
    to int64 first (a [4, 512, 3072] mask: 1.2 ms against 27 ms); a slice's bytes summed
    into an int32, cheaper per call than count_nonzero (a [8, 64, 112, 112] tensor's 49
    slices: 0.85 ms against 1.47). On a float tensor, count_nonzero itself is slower than
    making the mask and counting it (a ReLU's [8, 64, 112, 112] output: 34 ms against 8)."""
    if mask.numel() <= SLICE:
        return int(mask.view(torch.uint8).sum(dtype=torch.int32))
    return int(torch.count_nonzero(mask))


def dead_fraction(x: torch.Tensor, min_samples: int = DEAD_MIN_SAMPLES) -> float | None:
    """Share of features zero for the whole batch. Features: dim 1 of (B, F) and of
    (B, C, ...) images, the last dim of (B, S, F) sequences."""
    if x.dim() < 2:
        return None
    dim = x.dim() - 1 if x.dim() == 3 else 1
    if x.numel() // max(x.shape[dim], 1) < min_samples:
        return None  # with few values a feature can be all-zero by chance
    others = tuple(d for d in range(x.dim()) if d != dim)
    # zero throughout: largest and smallest both zero (NaN is neither); reductions in
    # place, no mask the size of x
    dead = x.amax(dim=others) == 0
    if dead.any():
        dead &= x.amin(dim=others) == 0
    return _count(dead) / dead.numel()


def _saturated(values: torch.Tensor, kind: str) -> float | None:
    if not values.numel():
        return None
    slices, near = Slices(values), 0
    for part in slices:
        if kind == "sigmoid":  # two disjoint sides
            near += slices.count_below(slices.same(part).copy_(part), _SATURATION)
            near += slices.count_above(slices.same(part).copy_(part), 1 - _SATURATION)
        else:
            magnitude = torch.abs(part, out=slices.same(part))
            near += slices.count_above(magnitude, 1 - _SATURATION)
    return near / values.numel()
