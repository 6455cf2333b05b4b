"""Gates: vector scales (1-D, or (C, 1, 1)) that start at (or within 1e-3 of) zero, or
weights that start at exactly zero (torchvision ViT's head), and silence what they scale at
initialisation, by design: layer scales (ConvNeXt, CaiT: gamma = 1e-6) and zero-initialised
residual norms (torchvision's zero_init_residual, LeViT's `bn_weight_init=0` projections).

Which layers a gate silences cannot be read from module paths alone (LeViT's zero BatchNorm
sits in `attn.proj`, and silences `attn.qkv`), so it is checked by what it does: the
gradients are taken again with every gate opened (set to 1), and a layer that is vanishing
only while the gates are closed is "gated", not the model's fault.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from inspector.context import Context
from inspector.health.state import preserved
from inspector.report import ParamGrad

__all__ = ["GATE_NAMES", "GATE_RMS", "gate_rows", "is_vector", "opened_grad_norms"]

# The names of parameters that scale a block's output: layer scales and norm gains.
GATE_NAMES = frozenset({"gamma", "weight", "scale", "gamma_1", "gamma_2", "layer_scale", "ls"})
GATE_RMS = 1e-3  # a gate this close to zero silences its block at initialisation


def is_vector(shape: list[int]) -> bool:
    """At most one dimension above 1: torchvision ConvNeXt's layer scale is (C, 1, 1), a
    vector that broadcasts over the feature map, not a matrix."""
    return sum(d > 1 for d in shape) <= 1


def gate_rows(params: list[ParamGrad]) -> list[ParamGrad]:
    """The gates: vectors, named like a scale, rms <= GATE_RMS, and receiving a gradient (a
    closed gate still learns: its own gradient is what opens it)."""
    gates = []
    for row in params:
        if not row.shape or not math.prod(row.shape) or not row.grad_norm:
            continue
        if row.name.rpartition(".")[2] not in GATE_NAMES:
            continue
        rms = (row.weight_norm or 0.0) / math.sqrt(math.prod(row.shape))
        # a scale near zero, or a matrix that is exactly zero (torchvision ViT's head)
        if (is_vector(row.shape) and rms <= GATE_RMS) or not row.weight_norm:
            gates.append(row)
    return gates


@contextmanager
def _opened(model: nn.Module, names: set[str]) -> Iterator[None]:
    params = [p for n, p in model.named_parameters() if n in names]
    with torch.no_grad():
        saved = [p.detach().clone() for p in params]
        for p in params:
            p.fill_(1.0)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, value in zip(params, saved, strict=True):
                p.copy_(value)


def opened_grad_norms(ctx: Context, gates: list[ParamGrad]) -> dict[str, float]:
    """Per-parameter gradient norms of the same forward + backward with the gates at 1."""
    from inspector.health.backprop import backward_once  # backprop imports the row types

    with preserved(ctx.model), _opened(ctx.model, {g.name for g in gates}):
        run = backward_once(ctx)
    return {name: stats.norm for name, stats in run.grads.items()} if run.backward_ran else {}
