"""The model's outputs as labelled tensors, and the loss the gradient pass backpropagates."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from inspector.context import Inputs

__all__ = [
    "flat_tensors", "float_outputs", "make_loss", "loss_outputs", "LossOutput", "DEFAULT_LOSS",
    "directions_kept",
]  # fmt: skip

DEFAULT_LOSS = (
    "sum over the floating outputs of mean(output * r), r a fixed random tensor (default: a "
    "random direction keeps gradients flowing through normalisation layers; pass "
    "loss_fn(output, inputs) for your own)"
)
# Why a random direction: mean(output) gives a gradient constant over the batch, which a
# BatchNorm head removes exactly (LeViT); mean(output**2) is constant behind a LayerNorm
# without affine change (sum of y**2 = D), so nothing flowed into HF DeBERTa-v2 (1e-9 RMS).
_PROBE_SEED = 20_161


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


# (label, shape, dtype) of an output the default loss is formed from
LossOutput = tuple[str, tuple[int, ...], torch.dtype]


def loss_outputs(output: Any) -> tuple[LossOutput, ...]:
    """The outputs the default loss is formed from, in its order."""
    return tuple(
        (label, tuple(t.shape), t.dtype) for label, t in float_outputs(output) if t.numel()
    )


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
    outputs = [t for _, t in float_outputs(output) if t.numel()]
    terms = [_term(t, _direction(t, i)) for i, t in enumerate(outputs)]
    if not terms:
        return None, "no floating output to form a loss from; pass loss_fn(output, inputs)"
    return torch.stack(terms).sum(), DEFAULT_LOSS


@contextmanager
def directions_kept() -> Iterator[None]:
    """Within the block, each output's direction is drawn once: the gradients pass forms
    the loss twice (the eager forward's, the replay's), and GPT-2 small's [4, 512, 50257]
    logits took 2 s to draw. Held only for the block."""
    global _kept
    _kept = {}
    try:
        yield
    finally:
        _kept = None


_kept: dict[tuple, torch.Tensor] | None = None


def _term(t: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """mean(t * direction) of one output, differentiable in t."""
    if t.dtype == torch.float32:
        return _DirectedMean.apply(t, direction)
    return (t.real.float() * direction).mean()


class _DirectedMean(torch.autograd.Function):
    """mean(t * r) for a float32 t, whose backward makes one tensor of t's size, the
    gradient r / numel times the incoming one, as `t.mean()`'s backward does: the
    measured training step forms its loss from the outputs' means, and the gradients
    pass's forward and backward stand for that step (inspector/memory/merged.py). The
    product (mean's and mul's backward) made a second, and the same values."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, r: torch.Tensor) -> torch.Tensor:  # noqa: ANN401
        ctx.save_for_backward(r)
        return (t * r).mean()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN401
        (r,) = ctx.saved_tensors
        return r * (grad / r.numel()), None


def _direction(t: torch.Tensor, index: int) -> torch.Tensor:
    """A fixed standard-normal tensor of t's shape (the same on every run and device)."""
    key = (tuple(t.shape), index, t.device)
    if _kept is not None and key in _kept:
        return _kept[key]
    gen = torch.Generator().manual_seed(_PROBE_SEED + index)
    direction = torch.randn(t.shape, generator=gen).to(t.device)
    if _kept is not None:
        _kept[key] = direction
    return direction
