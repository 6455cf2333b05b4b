"""Denormal floats flushed to zero while the memory pass runs.

Where the model runs only on a real copy (it branches on values: a detector's proposals),
the memory pass's steps compute values only to take the model's branches, and arithmetic
on denormal floats (below 1.2e-38 in float32) takes microcode assists on x86: torchvision's
Faster R-CNN (ResNet-50 FPN) took 9.4 s for its second step, under the next seed, against
0.8 s for the first, nearly all of it in MKL's sgemm. The bytes a step allocates do not
depend on such values; flushed (FTZ and DAZ), the same step took 1.15 s. The setting is
restored after: the passes that follow read values (numerics counts the values below
fp16's range), and a pass forked from this process would inherit it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["denormals_flushed", "flushing"]


@contextmanager
def denormals_flushed() -> Iterator[None]:
    """Denormals flushed to zero in this thread for the block, then as they were. Where
    the CPU cannot (torch says so), the block runs as it is."""
    was = flushing()
    if not torch.set_flush_denormal(True):
        yield
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(was)


def flushing() -> bool:
    """Whether this thread flushes denormals now (torch has no getter): a denormal times
    one is zero only where it does."""
    return (torch.tensor([1e-39]) * 1.0).item() == 0.0
