"""Fake copies: the model and inputs as fake tensors, so a step allocates nothing real.

`copy.deepcopy` with a memo that maps each parameter and buffer to a fresh fake tensor of
the same shape, stride and dtype copies the module tree without copying any weight; tied
weights stay tied (one memo entry). The user's model is never mutated.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_map

from inspector.context import Inputs
from inspector.fakevalues import give_value, new_fake_mode, value_of

__all__ = ["new_fake_mode", "fake_shadow", "fake_inputs", "real_shadow"]


def _fake_like(t: torch.Tensor, fake_mode: Any) -> torch.Tensor:
    """A fresh fake tensor like `t`; an integer or bool one keeps its values (masks and
    ids decide library branches: inspector.fakevalues)."""
    with fake_mode:
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    give_value(out, value_of(t) if isinstance(t, FakeTensor) else t)
    if isinstance(t, nn.Parameter):
        return nn.Parameter(out, requires_grad=t.requires_grad)
    return out.requires_grad_(t.requires_grad) if t.is_leaf else out


def fake_shadow(model: nn.Module, fake_mode: Any) -> nn.Module:
    """A deep copy of `model` whose parameters and buffers are new fake tensors."""
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in memo:
            memo[id(t)] = _fake_like(t, fake_mode)
    return copy.deepcopy(model, memo)


def fake_inputs(inputs: Inputs, fake_mode: Any) -> Inputs:
    """The inputs as fresh fake tensors (values do not matter to memory)."""

    def convert(x: Any) -> Any:
        return _fake_like(x, fake_mode) if isinstance(x, torch.Tensor) else x

    return Inputs(tree_map(convert, inputs.args), tree_map(convert, inputs.kwargs), inputs.dims)


def real_shadow(model: nn.Module) -> nn.Module:
    """A real deep copy, for a step that must not touch the user's weights."""
    return copy.deepcopy(model)


def clone_inputs(inputs: Inputs) -> Inputs:
    def convert(x: Any) -> Any:
        return x.detach().clone() if isinstance(x, torch.Tensor) else x

    return Inputs(tree_map(convert, inputs.args), tree_map(convert, inputs.kwargs), inputs.dims)
