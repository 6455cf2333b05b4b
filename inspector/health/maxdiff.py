"""max |a - b| of two float32 tensors as float64 computes it, at float32's cost.

Widening both tensors to float64 first costs two float64 copies and passes over them; on a
GPT-2 logits tensor ([4, 512, 50257]) that is 800 MB a copy. The difference is taken in
float32 instead, then again in float64 on the few elements whose float32 difference is
within rounding of the largest: a rounded difference is off by at most 2**-24 of itself,
so the element with the largest exact difference is among them, and the answer is the
float64 one bit for bit.
"""

from __future__ import annotations

import math

import torch

__all__ = ["float32_max_abs_diff"]

_CANDIDATE_MARGIN = 2.0**-20  # float32 rounds a difference by at most 2**-24 of it


def float32_max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """max |a - b| as `(a.double() - b.double()).abs().max()` gives it, for two float32
    tensors of one shape. None where the float64 path must answer: a value is not finite
    (each caller has its own rule for NaN and Inf), or a nonzero difference could have
    flushed to zero in float32."""
    diff = (a - b).abs_()
    largest = diff.max().item()
    if not math.isfinite(largest):
        return None
    if largest == 0.0:
        return 0.0 if torch.equal(a, b) else None
    near = diff >= largest * (1 - _CANDIDATE_MARGIN)
    del diff
    return (a[near].double() - b[near]).abs_().max().item()
