"""Build a model inside a FakeTensorMode: no weight memory, and no weight initialisation.

Initialisers such as `trunc_normal_` branch on tensor values (`if not mask.any()`), which a
fake tensor does not have. Values are meaningless in fake mode, so while the model is built
every `torch.nn.init` function leaves its tensor as it is.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

__all__ = [
    "building_under",
    "skip_init",
    "needs_values",
    "default_dtype",
    "empty_weights",
    "fake_weights",
]

_INIT_NAMES = [
    name
    for name in dir(torch.nn.init)
    if name.endswith("_") and not name.startswith("_") and callable(getattr(torch.nn.init, name))
]
# Private helpers that the public initialisers (and libraries' saved references) call.
_PRIVATE = ["_no_grad_trunc_normal_", "_no_grad_uniform_", "_no_grad_normal_", "_no_grad_fill_"]


def _keep(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


@contextmanager
def skip_init() -> Iterator[None]:
    """Make every `torch.nn.init` initialiser a no-op while the block runs."""
    module = torch.nn.init
    names = _INIT_NAMES + [n for n in _PRIVATE if hasattr(module, n)]
    saved = {name: getattr(module, name) for name in names}
    hf_saved = _transformers_init_table()
    try:
        for name in names:
            setattr(module, name, _keep)
        if hf_saved is not None:
            table, original = hf_saved
            table.update({key: _keep for key in original})
        yield
    finally:
        for name, fn in saved.items():
            setattr(module, name, fn)
        if hf_saved is not None:
            table, original = hf_saved
            table.update(original)
        else:
            _repair_late_table(module)


def _repair_late_table(module: Any) -> None:
    """transformers imported inside the block (a model file that imports it as it builds)
    copied the no-ops into its table: put torch's initialisers back, or every later real
    build in the process, such as `--fake`'s real copy, keeps uninitialised weights."""
    late = _transformers_init_table()
    if late is None:
        return
    table, _ = late
    for key, fn in table.items():
        if fn is _keep and hasattr(module, key):
            table[key] = getattr(module, key)


def _transformers_init_table() -> tuple[dict[str, Any], dict[str, Any]] | None:
    """transformers keeps its own references to torch's initialisers; patch those too."""
    init = sys.modules.get("transformers.initialization")
    table = getattr(init, "TORCH_INIT_FUNCTIONS", None)
    if not isinstance(table, dict):
        return None
    return table, dict(table)


@contextmanager
def default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """Tensors made meanwhile default to `dtype` (None: as they are)."""
    previous = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextmanager
def building_under(
    fake_mode: Any, device: str = "cpu", dtype: torch.dtype | None = None
) -> Iterator[None]:
    """The context to construct a model in: tensors made on `device` in `dtype` (no
    `.to()` after: fake parameters cannot be swapped), inside `fake_mode` with
    initialisers skipped."""
    with ExitStack() as stack:
        stack.enter_context(torch.device(device))
        stack.enter_context(default_dtype(dtype))
        if fake_mode is not None:
            stack.enter_context(fake_mode)
            stack.enter_context(skip_init())
        yield


# The exceptions a constructor raises when it computes with tensor values under fake
# tensors (`torch.linspace(0, rate, depth).tolist()`, RegNet's widths): fake tensors have no
# values to give.
_VALUE_NEEDED = ("DataDependentOutputException", "DynamicOutputShapeException")


def needs_values(exc: BaseException) -> bool:
    """Did building fail because the constructor read a tensor's values?"""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ in _VALUE_NEEDED or "data-dependent" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@contextmanager
def empty_weights(device: str = "cpu") -> Iterator[None]:
    """Build for real, with every parameter and buffer put on the meta device as it is
    registered: the constructor's own small computations (a linspace of drop rates) run
    with values, the weights take no memory. `fake_weights` then makes them fake."""
    register_parameter = torch.nn.Module.register_parameter
    register_buffer = torch.nn.Module.register_buffer

    def parameter(self: torch.nn.Module, name: str, param: Any) -> None:
        if param is not None:
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register_parameter(self, name, param)

    def buffer(self: torch.nn.Module, name: str, tensor: Any, persistent: bool = True) -> None:
        register_buffer(self, name, None if tensor is None else tensor.to("meta"), persistent)

    torch.nn.Module.register_parameter = parameter  # type: ignore[method-assign]
    torch.nn.Module.register_buffer = buffer  # type: ignore[method-assign]
    try:
        with torch.device(device), skip_init():
            yield
    finally:
        torch.nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
        torch.nn.Module.register_buffer = register_buffer  # type: ignore[method-assign]


def fake_weights(model: torch.nn.Module, fake_mode: Any, device: str) -> torch.nn.Module:
    """Swap the model's meta parameters and buffers (and plain meta tensor attributes) for
    fake tensors on `device`, tied ones staying tied."""
    made: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            with fake_mode:
                out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
            if isinstance(t, torch.nn.Parameter):
                out = torch.nn.Parameter(out, requires_grad=t.requires_grad)
            made[id(t)] = out
        return made[id(t)]

    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None and t.is_meta:
                    table[name] = fake(t)
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and value.is_meta and not name.startswith("_"):
                setattr(module, name, fake(value))
    return model
