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

__all__ = ["building_under", "skip_init"]

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


def _transformers_init_table() -> tuple[dict[str, Any], dict[str, Any]] | None:
    """transformers keeps its own references to torch's initialisers; patch those too."""
    init = sys.modules.get("transformers.initialization")
    table = getattr(init, "TORCH_INIT_FUNCTIONS", None)
    if not isinstance(table, dict):
        return None
    return table, dict(table)


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
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
        if dtype is not None:
            stack.enter_context(_default_dtype(dtype))
        if fake_mode is not None:
            stack.enter_context(fake_mode)
            stack.enter_context(skip_init())
        yield
