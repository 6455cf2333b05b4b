"""Meta kernels run once per op and shapes: a deep stack repeats the same layers.

Several of torch's meta kernels are Python decompositions into prims (`native_layer_norm`,
`addmm`): about 1 ms a call, where a kernel in C++ takes microseconds. A meta run of a
stack of 200 identical blocks called them 1,200 times for six answers. An op that only
makes new tensors (no input written, no output aliasing an input, no shape read from
values) gives outputs whose metadata follows from its inputs' metadata and its other
arguments; `MetaMemo` runs it once per such key and answers the rest with fresh meta
tensors of the same shape, strides and dtype, which is all a meta tensor has.
"""

from __future__ import annotations

from typing import Any

import torch

from inspector.dispatchmode import LeanDispatchMode

__all__ = ["MetaMemo", "makes_new_tensors", "flat_arguments", "PLAIN_ARGUMENTS"]

# Arguments other than tensors that key the memo as they are (hashable, and no SymInt,
# whose hash would read the value a symbolic shape stands for).
PLAIN_ARGUMENTS = (int, float, bool, str, type(None), torch.dtype, torch.device,
                   torch.layout, torch.memory_format)  # fmt: skip
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)  # not a subclass with its own rules
_DATA_DEPENDENT = {
    getattr(torch.Tag, name)
    for name in ("dynamic_output_shape", "data_dependent_output")
    if hasattr(torch.Tag, name)
}
_Spec = tuple[tuple[int, ...], tuple[int, ...], torch.dtype]


class MetaMemo(LeanDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.outputs: dict[tuple, tuple[bool, tuple[_Spec, ...]]] = {}
        self.hits = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        key = _key(func, args, kwargs) if makes_new_tensors(func) else None
        if key is None:
            return func(*args, **kwargs)
        known = self.outputs.get(key)
        if known is not None:
            self.hits += 1
            return _fresh(known)
        out = func(*args, **kwargs)
        spec = _spec(out)
        if spec is not None:
            self.outputs[key] = spec
        return out


def makes_new_tensors(func: Any) -> bool:
    """Whether `func`'s schema writes nothing and returns only new tensors, and no tag says
    its output shape depends on data."""
    if not isinstance(func, torch._ops.OpOverload):
        return False
    known = _NEW_TENSORS.get(func)
    if known is None:
        schema = func._schema
        known = _NEW_TENSORS[func] = (
            not schema.is_mutable
            and bool(schema.returns)
            and all(r.alias_info is None and str(r.type) == "Tensor" for r in schema.returns)
            and not _DATA_DEPENDENT & set(func.tags)
        )
    return known


_NEW_TENSORS: dict[Any, bool] = {}  # op -> whether it only makes new tensors (its schema)


def flat_arguments(args: tuple, kwargs: dict) -> tuple[tuple, list] | None:
    """(the arguments' structure, their leaves) for an op's arguments at most one list
    deep, as aten's are; None for deeper nesting or a dict. Made here, not by pytree:
    cheaper, and hashable on every torch (an older TreeSpec is not)."""
    structure: list[Any] = [len(args), tuple(kwargs)]
    leaves: list[Any] = []
    for x in (*args, *kwargs.values()):
        if isinstance(x, list | tuple):
            if any(isinstance(y, list | tuple | dict) for y in x):
                return None
            structure.append((type(x), len(x)))
            leaves.extend(x)
        elif isinstance(x, dict):
            return None
        else:
            structure.append(None)
            leaves.append(x)
    return tuple(structure), leaves


def _key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    flat_args = flat_arguments(args, kwargs)
    if flat_args is None:
        return None
    structure, flat = flat_args
    parts: list[Any] = [func, structure]
    for x in flat:
        if isinstance(x, torch.Tensor):
            if (
                x.device.type != "meta"
                or x.layout != torch.strided
                or type(x) not in _PLAIN_TENSORS
            ):
                return None
            parts.append((tuple(x.shape), x.stride(), x.dtype, x.storage_offset(), x.is_conj(),
                          x.is_neg()))  # fmt: skip
        elif isinstance(x, PLAIN_ARGUMENTS):
            parts.append((type(x), x))  # 1 and True and 1.0 are different arguments
        else:
            return None
    return tuple(parts)


def _spec(out: Any) -> tuple[bool, tuple[_Spec, ...]] | None:
    """(one tensor?, each output's metadata), or None where an output is not a plain new
    meta tensor."""
    outs = (out,) if isinstance(out, torch.Tensor) else out
    if not isinstance(outs, tuple) or not all(isinstance(t, torch.Tensor) for t in outs):
        return None
    specs = tuple(_one(t) for t in outs)
    return None if any(s is None for s in specs) else (isinstance(out, torch.Tensor), specs)


def _one(t: torch.Tensor) -> _Spec | None:
    if t.device.type != "meta" or t.layout != torch.strided or t.storage_offset() != 0:
        return None
    if type(t) is not torch.Tensor or t.is_conj() or t.is_neg():
        return None
    return tuple(t.shape), t.stride(), t.dtype


def _fresh(known: tuple[bool, tuple[_Spec, ...]]) -> Any:
    one, specs = known
    outs = tuple(
        torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        for shape, stride, dtype in specs
    )
    return outs[0] if one else outs
