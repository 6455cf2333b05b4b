"""Fake copies: the model and inputs as fake tensors, so a step allocates nothing real.

`copy.deepcopy` with a memo that maps each parameter and buffer to a fresh fake tensor of
the same shape, stride and dtype copies the module tree without copying any weight; tied
weights stay tied (one memo entry). Plain tensor attributes (a detector's anchors, kept in
a list) get fresh fakes too, and every FakeTensorMode maps to itself: deep-copying a fake
tensor copies its mode, whose converter holds weak references to storages, and freeing
those copies twice corrupts the heap (a native crash at the next garbage collection).
The user's model is never mutated.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._mode_utils import no_dispatch
from torch.utils._pytree import tree_flatten, tree_map

from inspector.context import Inputs
from inspector.fakevalues import give_value, new_fake_mode, value_of

__all__ = ["new_fake_mode", "fake_shadow", "fake_inputs", "real_shadow", "tensor_attributes"]


def _fake_like(t: torch.Tensor, fake_mode: Any) -> torch.Tensor:
    """A fresh fake tensor like `t`; an integer or bool one keeps its values (masks and
    ids decide library branches: inspector.fakevalues)."""
    maker = getattr(fake_mode, "maker", None)
    if maker is not None and t.device.type in ("cpu", "cuda"):
        # what the mode's empty_strided makes, without its dispatch (a 1,000-layer
        # stack's copy: 0.6 s of 1.4)
        with no_dispatch():
            elem = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        out = maker.new(elem, t.device)
    else:
        with fake_mode:
            out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    give_value(out, value_of(t) if isinstance(t, FakeTensor) else t)
    if isinstance(t, nn.Parameter):
        return nn.Parameter(out, requires_grad=t.requires_grad)
    return out.requires_grad_(t.requires_grad) if t.is_leaf else out


def fake_shadow(model: nn.Module, fake_mode: Any) -> nn.Module:
    """A deep copy of `model` whose parameters, buffers and plain tensor attributes are new
    fake tensors of `fake_mode`; no FakeTensorMode is copied."""
    memo: dict[int, Any] = {id(fake_mode): fake_mode}
    for t in [*model.parameters(), *model.buffers(), *tensor_attributes(model)]:
        mode = getattr(t, "fake_mode", None)
        if mode is not None:
            memo[id(mode)] = mode
        if id(t) not in memo:
            memo[id(t)] = _fake_like(t, fake_mode)
    return copy.deepcopy(model, memo)


def tensor_attributes(model: nn.Module) -> list[torch.Tensor]:
    """Tensors each module holds outside its parameters and buffers: in its attributes and
    in the lists, tuples and dicts there (torchvision's `AnchorGenerator.cell_anchors`)."""
    found: list[torch.Tensor] = []
    for module in model.modules():
        for name, value in vars(module).items():
            if name in _MODULE_TABLES or type(value) in _NO_TENSORS or _empty(value):
                continue  # most of a module's attributes: flags, sizes, empty hook tables
            if isinstance(value, torch.Tensor):
                found.append(value)
            else:
                found.extend(t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor))
    return found


_MODULE_TABLES = frozenset({"_parameters", "_buffers", "_modules"})
# attribute types that hold no tensor: not flattened (a module has about twenty hook
# tables and flags; MobileNetV3-small's 209 modules took 18 ms, most of it flattening them)
_NO_TENSORS = frozenset({bool, int, float, str, type(None), torch.dtype, torch.device})


def _empty(value: Any) -> bool:
    return type(value) in (dict, OrderedDict, list, tuple, set) and not value


def fake_inputs(inputs: Inputs, fake_mode: Any) -> Inputs:
    """The inputs as fresh fake tensors (values do not matter to memory). A tensor given
    twice (`input_ids` as `labels` too) stays one tensor, as it is in memory."""
    made: dict[int, torch.Tensor] = {}

    def convert(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) not in made:
            made[id(x)] = _fake_like(x, fake_mode)
        return made[id(x)]

    return Inputs(tree_map(convert, inputs.args), tree_map(convert, inputs.kwargs), inputs.dims)


def real_shadow(model: nn.Module) -> nn.Module:
    """A real deep copy, for a step that must not touch the user's weights."""
    return copy.deepcopy(model)


def clone_inputs(inputs: Inputs) -> Inputs:
    def convert(x: Any) -> Any:
        return x.detach().clone() if isinstance(x, torch.Tensor) else x

    return Inputs(tree_map(convert, inputs.args), tree_map(convert, inputs.kwargs), inputs.dims)
