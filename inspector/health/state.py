"""Run the user's model without leaving a trace: modes, buffers, RNG and grads restored."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["RngWatch", "preserved", "rng_watched", "seeded"]


@contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Restore every module's `training` flag, every buffer's value (BatchNorm running
    stats), the RNG state and the parameters' `.grad` after the block."""
    flags = [(m, m.training) for m in model.modules()]
    with torch.no_grad():
        buffers = [(b, b.detach().clone()) for b in model.buffers()]
    grads = [(p, p.grad) for p in model.parameters()]
    rng = _rng_states()
    try:
        yield
    finally:
        for module, flag in flags:
            module.training = flag
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        for param, grad in grads:
            param.grad = grad
        torch.set_rng_state(rng[0])
        if len(rng) > 1:
            torch.cuda.set_rng_state_all(list(rng[1:]))


def seeded(seed: int) -> None:
    """Same seed before each run, so dropout masks match between runs."""
    torch.manual_seed(seed)


def _rng_states() -> tuple[torch.Tensor, ...]:
    """torch's default CPU generator, then each CUDA device's (once CUDA is initialised)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return (torch.get_rng_state(), *cuda)


class RngWatch:
    """Set on leaving `rng_watched`: `drew`, whether the block drew from the generators
    `seeded` seeds. A run that drew nothing gives the same values under any seed; a
    model's own `torch.Generator` is not seen, nor reseeded by `seeded`."""

    drew: bool = False


@contextmanager
def rng_watched() -> Iterator[RngWatch]:
    watch, before = RngWatch(), _rng_states()
    try:
        yield watch
    finally:
        after = _rng_states()
        watch.drew = len(after) != len(before) or any(
            not torch.equal(a, b) for a, b in zip(after, before, strict=True)
        )
