"""Run a captured graph on meta tensors: shapes, dtypes and FLOPs without arithmetic.

A meta tensor has a shape, dtype and strides but no storage, and its kernels are C++
shape functions: a graph runs in the time of its Python overhead, whatever the batch, and
allocates nothing. The model's parameters, buffers and tensor attributes are swapped for
meta copies only for the run (`torch.func.functional_call`), so the user's model is never
touched. What needs values (`.item()`, `nonzero`) or a real device raises: the caller then
runs the graph on the real (or fake) tensors instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map_only

from inspector.graph.metamemo import MetaMemo

__all__ = [
    "meta_answers_shared",
    "meta_like",
    "on_meta_device",
    "run_on_meta",
    "single_device",
    "to_meta",
    "unique_tensor_names",
]


def single_device(module: nn.Module, values: Any) -> torch.device | None:
    """The one device of the module's tensors and the inputs; None when they differ."""
    devices = {t.device for t in _state(module).values()}
    devices |= {t.device for t in tree_leaves(values) if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        return None
    return next(iter(devices), torch.device("cpu"))


def on_meta_device(
    method: str | None, args: Any, kwargs: dict, device: torch.device
) -> tuple[Any, dict]:
    """The arguments of a call with `device` (a torch.device anywhere, a string as the
    `device=` keyword or the target of `.to(...)`) replaced by meta: graphs and traces
    bake the model's device in (`arange(n, device=cpu)`, `x.to(cpu)`)."""

    def swap(v: Any, name_ok: bool) -> Any:
        if isinstance(v, torch.device) or (name_ok and isinstance(v, str)):
            return torch.device("meta") if _same_device(v, device) else v
        return v

    args = tuple(swap(a, method == "to" and i == 1) for i, a in enumerate(args))
    kwargs = {k: swap(v, k == "device") for k, v in kwargs.items()}
    return args, kwargs


def _same_device(value: torch.device | str, device: torch.device) -> bool:
    try:
        d = torch.device(value)
    except (RuntimeError, TypeError):
        return False
    return d.type == device.type and d.index in (None, device.index)


def meta_like(t: torch.Tensor) -> torch.Tensor:
    meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    if isinstance(t, nn.Parameter):
        return nn.Parameter(meta, requires_grad=t.requires_grad)
    return meta.requires_grad_(t.requires_grad) if t.requires_grad else meta


def to_meta(values: Any) -> Any:
    """The same structure with every tensor replaced by a meta tensor like it."""
    return tree_map_only(torch.Tensor, meta_like, values)


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor the module reaches by name: parameters and buffers (each name of a
    tied one), and plain tensor attributes (constants of fx and export graphs). A module
    reached by two paths (timm CoaT's shared position encodings) is named once: swapped
    under both, the second swap saved the first's meta copy as the original and put it
    back, and the user's model kept meta parameters."""
    out: dict[str, torch.Tensor] = {}
    for prefix, sub in module.named_modules():
        dot = prefix + "." if prefix else ""
        for name, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and not name.startswith("__"):
                out[dot + name] = value
        for name, p in sub._parameters.items():
            if p is not None:
                out[dot + name] = p
        for name, b in sub._buffers.items():
            if b is not None:
                out[dot + name] = b
    return out


def unique_tensor_names(module: nn.Module) -> list[str]:
    """Parameter and buffer names, one per (module, attribute): what to swap so that each
    is swapped, and put back, once (tied tensors of distinct modules keep each name)."""
    names = []
    for prefix, sub in module.named_modules():
        dot = prefix + "." if prefix else ""
        names += [dot + n for n, t in sub._parameters.items() if t is not None]
        names += [dot + n for n, t in sub._buffers.items() if t is not None]
    return names


class _Call(nn.Module):
    def __init__(self, target: nn.Module, fn: Callable[[], Any]) -> None:
        super().__init__()
        self.target = target
        self.fn = fn

    def forward(self) -> Any:
        return self.fn()


_shared_answers: list[dict] = []  # the memo answers of the innermost `meta_answers_shared`


@contextmanager
def meta_answers_shared() -> Iterator[None]:
    """The meta runs inside share one memo (inspector/graph/metamemo.py): the graph pass
    runs the model on meta again for the module calls inside its leaves, and at each
    named dim changed; the same layers meet the same kernels (EfficientNet-B0's 38 batch
    norms, 5 ms each in a Python decomposition)."""
    _shared_answers.append({})
    try:
        yield
    finally:
        _shared_answers.pop()


def run_on_meta(module: nn.Module, fn: Callable[[], Any]) -> Any:
    """`fn()` while `module` holds meta copies of its tensors (tied ones stay tied)."""
    copies: dict[int, torch.Tensor] = {}
    state = {}
    for name, t in _state(module).items():
        if id(t) not in copies:
            copies[id(t)] = meta_like(t)
        state["target." + name] = copies[id(t)]
    # every name is given (tied ones too): torch's tying would swap a module reached by
    # two paths twice, as above
    with MetaMemo(_shared_answers[-1] if _shared_answers else None):
        return torch.func.functional_call(
            _Call(module, fn), state, (), strict=False, tie_weights=False
        )
