"""Value statistics of one tensor: range, zeros, NaN/Inf, dead ReLU features, saturated
sigmoid/tanh, float16 overflow and bfloat16 precision loss."""

from __future__ import annotations

import torch

from inspector.report import NumericStats

__all__ = ["tensor_stats", "DEAD_MIN_SAMPLES", "FP16_MAX", "FP16_MIN_NORMAL", "MASK_ABS"]

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
    nonzero = _count(x != 0)
    stats.zero_fraction = 1.0 - nonzero / x.numel()
    values = x
    if not torch.isfinite(x.sum()):  # rare: count and drop the NaN/Inf
        finite = torch.isfinite(x)
        stats.nan_count = _count(torch.isnan(x))
        stats.inf_count = _count(~finite) - stats.nan_count
        values = x[finite]
        nonzero -= stats.nan_count + stats.inf_count
    _moments(stats, values, nonzero)
    if kind == "relu":
        stats.dead_fraction = dead_fraction(x, min_samples)
    elif kind in ("sigmoid", "tanh"):
        stats.saturated_fraction = _saturated(values, kind)
    return stats


def _moments(stats: NumericStats, values: torch.Tensor, nonzero: int) -> None:
    """`nonzero`: the nonzero count of `values`, known by the caller. Each statistic is one
    pass over the values where it can be: a report runs this on every node's output."""
    if not values.numel():
        return
    low, high = torch.aminmax(values)
    stats.min, stats.max = low.item(), high.item()
    magnitude = values.abs()
    if max(-stats.min, stats.max) > FP16_MAX:  # else no value can overflow: no pass
        stats.fp16_overflow_count = _count((magnitude > FP16_MAX) & (magnitude < MASK_ABS))
    else:
        stats.fp16_overflow_count = 0
    if nonzero:
        zeros = values.numel() - nonzero  # below the normal range and not zero: tiny
        tiny = _count(magnitude < FP16_MIN_NORMAL) - zeros
        stats.fp16_underflow_fraction = tiny / nonzero
    if max(-stats.min, stats.max) >= MASK_ABS:  # mask constants would swamp mean and std
        values = values[magnitude < MASK_ABS]
    if values.numel():
        wide = values.double()  # one float64 copy for both moments
        stats.mean = wide.mean().item()
        stats.std = wide.std(unbiased=False).item()
        del wide
        stats.bf16_error = _bf16_error(values, stats.std)


def _count(mask: torch.Tensor) -> int:
    """True elements of a bool mask: count_nonzero, not `.sum()`, which widens the mask
    to int64 first (a [4, 512, 3072] mask: 1.2 ms against 27 ms). On a float tensor,
    count_nonzero itself is slower than making the mask and counting it (a ReLU's
    [8, 64, 112, 112] output: 34 ms against 8)."""
    return int(torch.count_nonzero(mask))


def _bf16_error(values: torch.Tensor, std: float) -> float | None:
    """rms(x - bf16(x)) / std(x); None for constants."""
    if values.numel() < 2 or std == 0:
        return None
    error = values - values.bfloat16().to(values.dtype)
    return torch.linalg.vector_norm(error).item() / (values.numel() ** 0.5) / std


def dead_fraction(x: torch.Tensor, min_samples: int = DEAD_MIN_SAMPLES) -> float | None:
    """Share of features zero for the whole batch. Features: dim 1 of (B, F) and of
    (B, C, ...) images, the last dim of (B, S, F) sequences."""
    if x.dim() < 2:
        return None
    dim = x.dim() - 1 if x.dim() == 3 else 1
    if x.numel() // max(x.shape[dim], 1) < min_samples:
        return None  # with few values a feature can be all-zero by chance
    others = tuple(d for d in range(x.dim()) if d != dim)  # reduced in place, no copy
    return (x != 0).any(dim=others).logical_not().double().mean().item()


def _saturated(values: torch.Tensor, kind: str) -> float | None:
    if not values.numel():
        return None
    if kind == "sigmoid":
        near = (values < _SATURATION) | (values > 1 - _SATURATION)
    else:
        near = values.abs() > 1 - _SATURATION
    return near.double().mean().item()
