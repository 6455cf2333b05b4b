"""The model's outputs as labelled tensors, and the loss the gradient pass backpropagates."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from inspector.context import Inputs

__all__ = ["flat_tensors", "float_outputs", "make_loss", "DEFAULT_LOSS"]

DEFAULT_LOSS = (
    "sum over the floating outputs of mean(output**2) (default: squares keep gradients "
    "flowing through normalisation layers; pass loss_fn(output, inputs) for your own)"
)


def flat_tensors(value: Any, label: str = "output") -> Iterator[tuple[str, torch.Tensor]]:
    """(label, tensor) for every tensor in nested tuples, lists, dicts and HF ModelOutputs."""
    if isinstance(value, torch.Tensor):
        yield label, value
    elif isinstance(value, dict):  # also transformers' ModelOutput (an OrderedDict)
        for key, item in value.items():
            yield from flat_tensors(item, f"{label}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from flat_tensors(item, f"{label}[{i}]")


def float_outputs(output: Any) -> list[tuple[str, torch.Tensor]]:
    return [(k, t) for k, t in flat_tensors(output) if t.is_floating_point() or t.is_complex()]


def make_loss(
    output: Any, inputs: Inputs, loss_fn: Callable[[Any, Inputs], torch.Tensor] | None
) -> tuple[torch.Tensor | None, str]:
    """(scalar loss, how it was formed); loss None when no floating output exists."""
    if loss_fn is not None:
        loss = loss_fn(output, inputs)
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"loss_fn returned {type(loss).__name__}, expected a tensor")
        if loss.numel() != 1:
            return (
                loss.sum(),
                f"loss_fn(output, inputs).sum() (it returned shape {list(loss.shape)})",
            )
        return loss.reshape(()), "loss_fn(output, inputs)"
    terms = [t.real.float().pow(2).mean() for _, t in float_outputs(output) if t.numel()]
    if not terms:
        return None, "no floating output to form a loss from; pass loss_fn(output, inputs)"
    return torch.stack(terms).sum(), DEFAULT_LOSS
