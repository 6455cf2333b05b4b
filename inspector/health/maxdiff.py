"""max |a - b| of two float32 tensors as float64 computes it, at float32's cost, and
allclose, slice by slice.

Widening both tensors to float64 first costs two float64 copies and passes over them; on a
GPT-2 logits tensor ([4, 512, 50257]) that is 800 MB a copy. The difference is taken in
float32 instead, then again in float64 on the few elements whose float32 difference is
within rounding of the largest: a rounded difference is off by at most 2**-24 of itself,
so the element with the largest exact difference is among them, and the answer is the
float64 one bit for bit.

Both go through the values in slices (inspector/health/slices.py), as a difference the size
of the tensors costs its fresh pages: on two [8, 64, 112, 112] tensors, 20 ms for the
maximum and 82 ms for `torch.allclose`, against 4 and 8 ms in slices.
"""

from __future__ import annotations

import math

import torch

from inspector.health.slices import SLICE, paired

__all__ = ["float32_max_abs_diff", "all_close"]

_CANDIDATE_MARGIN = 2.0**-20  # float32 rounds a difference by at most 2**-24 of it


def float32_max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """max |a - b| as `(a.double() - b.double()).abs().max()` gives it, for two float32
    tensors of one shape. None where the float64 path must answer: a value is not finite
    (each caller has its own rule for NaN and Inf), or a nonzero difference could have
    flushed to zero in float32."""
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)  # views, or one copy each if strided
    buffer = torch.empty(min(a.numel(), SLICE), dtype=torch.float32)
    into = torch.empty((), dtype=torch.float32)  # not a new tensor a slice (slices.py)
    largest_by_slice: list[tuple[int, float]] = []
    for start, x, y in paired(flat_a, flat_b):
        part = torch.amax(_abs_diff(x, y, buffer), 0, out=into).item()
        if not math.isfinite(part):
            return None
        largest_by_slice.append((start, part))
    largest = max((part for _, part in largest_by_slice), default=0.0)
    if largest == 0.0:
        return 0.0 if torch.equal(a, b) else None
    threshold = largest * (1 - _CANDIDATE_MARGIN)
    exact = 0.0
    for start, part in largest_by_slice:
        if part < threshold:  # no candidate in this slice
            continue
        x, y = flat_a[start : start + SLICE], flat_b[start : start + SLICE]
        near = _abs_diff(x, y, buffer) >= threshold
        exact = max(exact, (x[near].double() - y[near]).abs_().max().item())
    return exact


def _abs_diff(x: torch.Tensor, y: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    return torch.sub(x, y, out=buffer[: x.numel()]).abs_()


def all_close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> bool:
    """`torch.allclose(a, b, rtol, atol, equal_nan=True)`, slice by slice: the same test
    on each slice, without a tensor-size mask and difference."""
    if a.shape != b.shape:
        return False
    return all(
        torch.isclose(x, y, rtol=rtol, atol=atol, equal_nan=True).all().item()
        for _, x, y in paired(a, b)
    )
