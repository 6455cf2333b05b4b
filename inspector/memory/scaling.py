"""Peak memory against batch size: a linear fit from runs at two or more batch sizes, and
the largest batch that fits a memory budget.

The training step's peak is the larger of two phases: forward/backward, which grows with
the batch (activations), and the optimizer step, which hardly does (params, grads and
state; only the inputs grow). Each phase gets its own line `fixed + per_sample * batch`;
the largest batch is the largest b where both lines stay within the budget.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from inspector.context import InputFactory, Inputs

__all__ = ["Line", "fit_line", "max_batch", "batch_size_of", "inputs_at_batch", "MAX_BATCH"]

MAX_BATCH = 2**20  # reported when memory does not grow with the batch


@dataclass(frozen=True)
class Line:
    fixed: float
    per_sample: float

    def at(self, batch: int) -> float:
        return self.fixed + self.per_sample * batch


def fit_line(points: list[tuple[int, int]]) -> Line:
    """Least-squares line through (batch, bytes) points (exact for two points)."""
    if len({b for b, _ in points}) < 2:
        raise ValueError("a batch fit needs runs at two or more batch sizes")
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((b - mean_b) ** 2 for b, _ in points)
    slope = sum((b - mean_b) * (y - mean_y) for b, y in points) / var
    return Line(mean_y - slope * mean_b, slope)


def max_batch(lines: list[Line], budget: int) -> int:
    """Largest batch b >= 1 with every line's bytes <= budget; 0 when batch 1 does not fit."""
    best = MAX_BATCH
    for line in lines:
        if line.at(1) > budget:
            return 0
        if line.per_sample > 0:
            best = min(best, int((budget - line.fixed) // line.per_sample))
    return max(best, 1)


def batch_size_of(factory: InputFactory, inputs: Inputs) -> tuple[str | None, int | None]:
    """(name of the batch dim or None, its current size) or (None, None) when unknown."""
    name = factory.batch_dim
    if name is not None and name in inputs.dims:
        return name, inputs.dims[name]
    tensors = [t for t in inputs.tensors() if t.dim() > 0]
    return (None, tensors[0].shape[0]) if tensors else (None, None)


def inputs_at_batch(
    factory: InputFactory, inputs: Inputs, batch: int, fake_mode: Any, device: str = "cpu"
) -> Inputs:
    """The inputs rebuilt at `batch`, as fake tensors: from the factory when it names the
    batch dim, else every tensor whose first dim equals the first input's first dim."""
    name, current = batch_size_of(factory, inputs)
    with fake_mode or nullcontext():
        if name is not None:
            return factory.build(dims={name: batch}, device=device)

        def resize(x: Any) -> Any:
            if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] != current:
                return x
            out = torch.empty((batch, *x.shape[1:]), dtype=x.dtype, device=x.device)
            return out.requires_grad_(x.requires_grad)

        return Inputs(tree_map(resize, inputs.args), tree_map(resize, inputs.kwargs), inputs.dims)
