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

import functools
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
_Answer = tuple[bool, tuple[_Spec, ...]]  # (one tensor?, each output's metadata)


class MetaMemo(LeanDispatchMode):
    """`outputs`: the answers of an earlier memo to go on from (its keys hold every
    argument's metadata: an answer stands wherever the op meets the same)."""

    def __init__(self, outputs: dict[tuple, _Answer] | None = None) -> None:
        super().__init__()
        self.outputs: dict[tuple, _Answer] = {} if outputs is None else outputs
        self.hits = 0
        self.in_place = 0  # in-place writes answered with their input (`writes_self_only`)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if writes_self_only(func) and _plain_float_meta(args[0]):
            self.in_place += 1
            return args[0]  # a meta tensor has no values to write: nothing changes
        new, writes = _makes_new_tensors_on_meta(func)
        key = _key(func, args, kwargs) if new else None
        if key is None:
            return func(*args, **kwargs)
        known = self.outputs.get(key)
        if known is not None:
            self.hits += 1
            return _fresh(known)
        if writes and writes[-1] >= len(args):  # a written argument given by keyword
            return func(*args, **kwargs)
        before = [_described(args[i]) for i in writes]
        out = func(*args, **kwargs)
        spec = _spec(out)
        # where the op changed a written argument's metadata, the answer is not only `out`
        if spec is not None and before == [_described(args[i]) for i in writes]:
            self.outputs[key] = spec
        return out


@functools.cache
def writes_self_only(func: Any) -> bool:
    """Whether `func` writes its first argument, a tensor, in place and returns it, with
    no other tensor argument and no change to its shape or strides (`hardswish_`,
    `relu_`, `fill_`): on meta tensors such an op only returns its input. Torch runs
    several as Python decompositions (an out-of-place op copied back): 7 ms a
    `hardswish_` call on meta, MobileNetV3's 19 calls a third of its graph pass."""
    if not isinstance(func, torch._ops.OpOverload) or _INPLACE_VIEW in func.tags:
        return False
    schema, name = func._schema, func._schema.name
    if not schema.arguments or len(schema.returns) != 1 or "_resize" in name:
        return False
    first, returned = schema.arguments[0], schema.returns[0]
    written = first.alias_info is not None and first.alias_info.is_write
    if not written or str(first.type) != "Tensor" or returned.alias_info is None:
        return False
    if "bitwise" in name or "shift" in name or name.split("::")[-1].startswith("__"):
        return False  # float tensors refuse them: the kernel must say so
    return not any("Tensor" in str(a.type) for a in schema.arguments[1:])


def _plain_float_meta(t: Any) -> bool:
    """A meta tensor of a float dtype, no subclass: any number argument casts to it."""
    return type(t) is torch.Tensor and t.device.type == "meta" and t.is_floating_point()


@functools.cache
def _makes_new_tensors_on_meta(func: Any) -> tuple[bool, tuple[int, ...]]:
    """Whether `func` returns only new tensors on meta, and the positions of the
    arguments it writes: an op that also updates an argument in place (`native_batch_norm`
    its running statistics) changes no metadata of a meta tensor, so its outputs follow
    from its inputs all the same (checked on each first call)."""
    if makes_new_tensors(func):
        return True, ()
    if not _returns_only_new(func) or _INPLACE_VIEW in func.tags:
        return False, ()
    arguments = func._schema.arguments
    writes = tuple(
        i for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write
    )
    tensors = all(str(arguments[i].type) in ("Tensor", "Optional[Tensor]") for i in writes)
    return bool(writes) and tensors, writes


def _described(x: Any) -> Any:
    """A written argument's metadata (None stays None)."""
    if not isinstance(x, torch.Tensor):
        return x
    return tuple(x.shape), x.stride(), x.dtype, x.storage_offset(), type(x), x.device


@functools.cache
def makes_new_tensors(func: Any) -> bool:
    """Whether `func`'s schema writes nothing and returns only new tensors, and no tag says
    its output shape depends on data."""
    return _returns_only_new(func) and not func._schema.is_mutable


def _returns_only_new(func: Any) -> bool:
    """Whether an op's schema returns only new tensors (no alias of an argument), and no
    tag says their shape depends on data."""
    if not isinstance(func, torch._ops.OpOverload):
        return False
    returns = func._schema.returns
    fresh = all(r.alias_info is None and str(r.type) == "Tensor" for r in returns)
    return bool(returns) and fresh and not _DATA_DEPENDENT & set(func.tags)


_INPLACE_VIEW = getattr(torch.Tag, "inplace_view", None)


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
