"""Tensors inside arbitrary outputs, and their TensorInfo (shape, dtype, device, bytes)."""

from __future__ import annotations

from typing import Any

import torch

from inspector.report import TensorInfo

__all__ = ["tensor_leaves", "tensor_info", "nbytes"]

_MAX_DEPTH = 8


def tensor_leaves(obj: Any, also: type | None = None) -> list[torch.Tensor]:
    """Every tensor in `obj`, depth first: tuples, lists, dicts, and plain objects such as
    Hugging Face's ModelOutput or caches (which pytree does not know). `also`: a type to
    collect as if it were a tensor (fx proxies)."""
    out: list[torch.Tensor] = []
    _walk(obj, set(), out, 0, (torch.Tensor, also) if also else torch.Tensor)
    return out


def _walk(obj: Any, seen: set[int], out: list[torch.Tensor], depth: int, kinds: Any) -> None:
    if isinstance(obj, kinds):
        out.append(obj)
        return
    if depth > _MAX_DEPTH or id(obj) in seen or isinstance(obj, str | bytes | int | float):
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        items: Any = obj.values()
    elif isinstance(obj, list | tuple | set | frozenset):
        items = obj
    elif hasattr(obj, "__dict__") and not _opaque(obj):
        items = vars(obj).values()
    else:
        return
    for item in items:
        _walk(item, seen, out, depth + 1, kinds)


def _opaque(obj: Any) -> bool:
    """Objects whose attributes hold no output tensors, and can reach far: a module, a
    class, a SymInt (its node reaches the whole shape environment), torch internals."""
    if isinstance(obj, torch.nn.Module | type):
        return True
    module = type(obj).__module__ or ""
    return module.startswith(("torch.", "sympy", "logging")) or module == "torch"


def nbytes(t: torch.Tensor) -> int:
    # numel * itemsize: the logical size, the same for real and fake tensors.
    return t.numel() * t.element_size()


def tensor_info(t: torch.Tensor, device: torch.device | None = None) -> TensorInfo:
    """`device`: the device a meta tensor stands for."""
    return TensorInfo(
        shape=[int(d) for d in t.shape],
        dtype=str(t.dtype).removeprefix("torch."),
        device=str(device if device is not None else t.device),
        bytes=nbytes(t),
    )
