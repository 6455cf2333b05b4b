"""Input factories for inputs the model source brings itself: an `example_inputs()`
function, the example inputs of a `.pt2` archive, or a tensor file."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from inspector.context import InputFactory, Inputs
from inspector.errors import UserCodeError
from inspector.loaders.usercode import user_code_error

__all__ = [
    "ExampleFactory",
    "TensorsFactory",
    "split_example",
    "forward_params",
    "materialize",
]


class ExampleFactory(InputFactory):
    """Calls the user's `example_inputs()` at each build, so that under a fake mode its
    tensors are created fake and no input memory is allocated."""

    def __init__(
        self, func: Callable[[], Any], model: nn.Module, user_files: list[str], where: str
    ) -> None:
        super().__init__(spec={"from": f"example_inputs() in {where}"})
        self.func, self.model, self.user_files, self.where = func, model, user_files, where

    def build(self, dims: dict[str, int] | None = None, device: str = "cpu") -> Inputs:
        try:
            value = self.func()
        except Exception as exc:
            raise user_code_error(
                UserCodeError, f"example_inputs() in {self.where}", exc, self.user_files
            ) from exc
        try:
            args, kwargs = split_example(value, self.model)
        except TypeError as exc:
            raise UserCodeError(
                f"example_inputs() in {self.where} returned {exc}",
                hint="Return a tensor, a tuple of positional inputs, a dict of keyword "
                "inputs, or (args_tuple, kwargs_dict).",
            ) from None
        return Inputs(materialize(args, device), materialize(kwargs, device))


class TensorsFactory(InputFactory):
    """Fixed tensors (a .pt2's example inputs, a tensor file): each build returns copies."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], spec: object) -> None:
        super().__init__(spec=spec)
        self.args, self.kwargs = tuple(args), dict(kwargs)

    def build(self, dims: dict[str, int] | None = None, device: str = "cpu") -> Inputs:
        return Inputs(
            materialize(self.args, device, copy=True), materialize(self.kwargs, device, copy=True)
        )


def split_example(value: Any, model: nn.Module | None = None) -> tuple[tuple, dict]:
    """(args, kwargs) from a tensor, a tuple/list of positional inputs, a dict, or
    (args_tuple, kwargs_dict). A dict is keyword inputs when its keys are `forward`'s
    parameters, else one dict argument. Raises TypeError naming what was returned."""
    if isinstance(value, torch.Tensor):
        return (value,), {}
    if isinstance(value, dict):
        return _dict_inputs(value, model)
    if isinstance(value, (tuple, list)):
        if len(value) == 2 and isinstance(value[0], (tuple, list)) and isinstance(value[1], dict):
            return tuple(value[0]), dict(value[1])
        return tuple(value), {}
    raise TypeError(f"a {type(value).__name__}, not inputs")


def _dict_inputs(value: dict, model: nn.Module | None) -> tuple[tuple, dict]:
    params = forward_params(model) if model is not None else None
    keys_ok = all(isinstance(k, str) for k in value)
    if keys_ok and (params is None or _accepts_var_keyword(model) or set(value) <= set(params)):
        return (), dict(value)
    return (value,), {}


def forward_params(model: nn.Module) -> dict[str, inspect.Parameter] | None:
    """The parameters of `model.forward` by name, or None when they cannot be read
    (TorchScript, C++ modules)."""
    try:
        return dict(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return None


def _accepts_var_keyword(model: nn.Module | None) -> bool:
    params = forward_params(model) if model is not None else None
    return bool(params) and any(p.kind is p.VAR_KEYWORD for p in params.values())


def materialize(tree: Any, device: str, copy: bool = False) -> Any:
    """Tensors of `tree` on `device`; under an active FakeTensorMode, as fake tensors
    (a real tensor would otherwise allocate memory and mix real with fake)."""
    mode = torch._guards.detect_fake_mode()

    def convert(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if mode is not None and not isinstance(value, torch._subclasses.FakeTensor):
            value = mode.from_tensor(value)
            return value.to(device)
        moved = value.to(device)
        return moved.clone() if copy and moved is value else moved

    return tree_map(convert, tree)
