"""The loss a training step differentiates, the same in the estimate and the measurement.

`loaded.loss_fn(output, inputs)` when the model source gives one; else the default: the
sum over the output's floating tensors that require grad of their `.mean()`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from inspector.context import Inputs

__all__ = ["default_loss", "compute_loss", "DefaultLossRefused", "DEFAULT_LOSS_TEXT"]

DEFAULT_LOSS_TEXT = "sum of the floating outputs' means"
LossFn = Callable[[Any, Inputs], torch.Tensor]


def _leaves(output: Any) -> list[Any]:
    if hasattr(output, "to_tuple"):  # transformers' ModelOutput
        output = output.to_tuple()
    return tree_leaves(output)


class DefaultLossRefused(ValueError):
    """The default loss found no floating output that requires grad."""


def default_loss(output: Any, inputs: Inputs) -> torch.Tensor:
    terms = [
        t.mean()
        for t in _leaves(output)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
    ]
    if not terms:
        raise DefaultLossRefused(
            "the model's output has no floating tensor that requires grad, so there is "
            "nothing to train; give a loss_fn(output, inputs) or check requires_grad."
        )
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def compute_loss(loss_fn: LossFn | None, output: Any, inputs: Inputs) -> torch.Tensor:
    loss = (loss_fn or default_loss)(output, inputs)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ValueError("loss_fn must return a scalar tensor")
    return loss
