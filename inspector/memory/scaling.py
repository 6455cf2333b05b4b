"""Peak memory against batch size: a linear fit from runs at two or more batch sizes, and
the largest batch that fits a memory budget.

The training step's peak is the largest of the peaks of its stretches (between two
timeline marks: a module's forward, an autograd node's backward, the optimizer step), and
each grows at its own rate: the end of the forward with every activation kept, the end of
the backward hardly (gradients, no activations), the optimizer step not at all. Each
stretch gets its own line `fixed + per_sample * batch` (exact when the op sequence does
not change with the batch); the largest batch is the largest b where every line stays
within the budget. One line through the step's peaks would not do: at small batches the
peak is often the end of the backward, which barely grows, while the forward's peak
overtakes it further out (GPT-2: 1,048,576 "fitting" 16 GiB).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from inspector.context import InputFactory, Inputs

__all__ = [
    "MAX_BATCH", "Line", "batch_size_of", "fit_line", "inputs_at_batch", "max_batch",
    "phase_lines", "steepest", "window_lines",
]  # fmt: skip

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


def window_lines(runs: list[tuple[int, list[int]]]) -> list[Line] | None:
    """One line per stretch of the step between two timeline marks, through its peak in
    runs at several batches; None when the runs do not have the same stretches (the op
    sequence changed with the batch)."""
    if len({len(w) for _, w in runs}) != 1:
        return None
    return [fit_line([(b, w[i]) for b, w in runs]) for i in range(len(runs[0][1]))]


def phase_lines(runs: list[tuple[int, dict[str, int]]]) -> list[Line]:
    """One line per phase through (batch, that phase's peak): coarser than window_lines."""
    phases = sorted({p for _, peaks in runs for p in peaks})
    return [fit_line([(b, peaks.get(p, 0)) for b, peaks in runs]) for p in phases]


def steepest(lines: list[Line]) -> Line:
    """The line that bounds large batches: the fastest-growing one (the larger fixed part
    breaks a tie)."""
    return max(lines, key=lambda line: (line.per_sample, line.fixed))


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
