"""Run the user's model without leaving a trace: modes, buffers, RNG and grads restored."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["preserved", "seeded", "rng_watched"]


@contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Restore every module's `training` flag, every buffer's value (BatchNorm running
    stats), the RNG state and the parameters' `.grad` after the block."""
    flags = [(m, m.training) for m in model.modules()]
    with torch.no_grad():
        buffers = [(b, b.detach().clone()) for b in model.buffers()]
    grads = [(p, p.grad) for p in model.parameters()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
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
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def seeded(seed: int) -> None:
    """Same seed before each run, so dropout masks match between runs."""
    torch.manual_seed(seed)


def _rng_states() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return (torch.get_rng_state(), *cuda)


@contextmanager
def rng_watched() -> Iterator[Callable[[], bool]]:
    """`drew()` after the block: whether it drew from the generators `seeded` seeds (torch's
    default CPU and CUDA generators). A run that drew nothing gives the same values under
    any seed; a model's own `torch.Generator` is not seen, nor reseeded by `seeded`."""
    before: tuple = _rng_states()
    after: list[tuple] = []
    try:
        yield (
            lambda: (
                len(after[0]) != len(before)
                or any(not torch.equal(a, b) for a, b in zip(after[0], before, strict=True))
            )
        )
    finally:
        after.append(_rng_states())
