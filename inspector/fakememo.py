"""Fake ops that only make new tensors, answered from their first call's outputs.

The fake mode's own dispatch cache already reuses an op's output metadata, but each call
still pays about 70 us to hash its arguments in general (every tensor's dozen properties,
symbolic sizes, nested containers) and 50 us to rebuild the outputs. On a deep stack a
fake training step is thousands of such calls with a handful of distinct keys.

`FakeMemo` keys the narrow case only: an op whose schema says it writes nothing and
returns new tensors (inspector/graph/metamemo.py's test), every tensor argument a plain
fake tensor of this mode (no constant, no real value, no symbolic size), the other
arguments plain values. The first call takes the fake mode's whole path; its outputs are
kept when each is a fresh fake tensor of this mode owning its storage. Later calls with
the same key get fresh fake tensors of those shapes, strides, dtypes and devices.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, in_kernel_invocation_manager
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from inspector.fakenew import FakeMaker
from inspector.graph.metamemo import PLAIN_ARGUMENTS, flat_arguments, makes_new_tensors

__all__ = ["FakeMemo", "plain_fake_key", "input_storages", "fresh_output"]

_Spec = tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device]


class FakeMemo:
    """Per fake mode: op and argument metadata -> (one tensor?, each output's spec)."""

    def __init__(
        self, mode: FakeTensorMode, has_value: Any, maker: FakeMaker | None = None
    ) -> None:
        self.mode = mode
        self.maker = maker or FakeMaker(mode)
        self.has_value = has_value  # t -> whether it carries a real value
        self.outputs: dict[tuple, tuple[bool, tuple[_Spec, ...]]] = {}
        self.hits = 0

    def key(self, func: Any, args: tuple, kwargs: dict) -> tuple | None:
        """The memo's key for this call, or None where the memo does not answer it."""
        mode = self.mode
        if mode.shape_env is not None or not makes_new_tensors(func):
            return None
        if get_proxy_mode() is not None:  # tracing: the tracer follows each op's own outputs
            return None
        # what else the fake mode's own cache keys on: a default dtype or device may be
        # an output's, and inference tensors are another kind
        head = [torch.get_default_dtype(), _default_device(), torch.is_inference_mode_enabled()]
        return plain_fake_key(self, func, args, kwargs, head, _exact)

    def answer(self, key: tuple) -> Any:
        """Fresh outputs for a key seen before, or None."""
        known = self.outputs.get(key)
        if known is None:
            return None
        self.hits += 1
        one, specs = known
        with in_kernel_invocation_manager(self.mode):
            metas = [
                torch.empty_strided(shape, stride, dtype=dtype, device="meta")
                for shape, stride, dtype, _ in specs
            ]
        new = self.maker.new
        outs = tuple(new(meta, spec[3]) for meta, spec in zip(metas, specs, strict=True))
        return outs[0] if one else outs

    def remember(self, key: tuple, args: tuple, kwargs: dict, out: Any) -> None:
        """Keep `out`'s specs when each output is a new fake tensor owning its storage."""
        outs = (out,) if isinstance(out, torch.Tensor) else out
        if not isinstance(outs, tuple) or not outs:
            return
        inputs = input_storages(args, kwargs)
        if not all(fresh_output(self, t, inputs) for t in outs):
            return
        specs = [(tuple(t.shape), t.stride(), t.dtype, t.fake_device) for t in outs]
        self.outputs[key] = (isinstance(out, torch.Tensor), tuple(specs))


def _exact(x: FakeTensor) -> tuple:
    return (tuple(x.shape), x.stride(), x.dtype, x.storage_offset(), x.fake_device,
            x.is_conj(), x.is_neg(), x.requires_grad)  # fmt: skip


def plain_fake_key(
    keeper: Any, func: Any, args: tuple, kwargs: dict, head: list, describe: Any
) -> tuple | None:
    """A key for a call whose tensors are plain fake tensors of `keeper.mode` (no constant,
    no real value, strided), arguments at most one list deep: the op, the arguments'
    structure, `head`, then `describe(t)` per tensor and (type, value) per other argument.
    None for any other call, for a tensor `describe` refuses (None), or for no tensor (a
    factory may be given a value: inspector.fakevalues)."""
    flat_args = flat_arguments(args, kwargs)
    if flat_args is None:
        return None
    structure, flat = flat_args
    parts: list[Any] = [func, structure, *head]
    tensors = 0
    for x in flat:
        if type(x) is FakeTensor:
            if x.fake_mode is not keeper.mode or x.constant is not None or keeper.has_value(x):
                return None
            part = describe(x) if x.layout == torch.strided else None
            if part is None:
                return None
            parts.append(part)
            tensors += 1
        elif isinstance(x, torch.Tensor):  # real, or another subclass: its own rules
            return None
        elif isinstance(x, PLAIN_ARGUMENTS):
            parts.append((type(x), x))  # 1 and True and 1.0 are different arguments
        else:
            return None
    return tuple(parts) if tensors else None


def input_storages(args: tuple, kwargs: dict) -> set[int]:
    """The storages of a call's tensor arguments."""
    flat = (flat_arguments(args, kwargs) or ((), []))[1]
    return {x.untyped_storage()._cdata for x in flat if isinstance(x, torch.Tensor)}


def fresh_output(keeper: Any, t: Any, inputs: set[int]) -> bool:
    """Whether `t` is a new plain fake tensor of `keeper.mode` owning a storage of its own:
    no input's, no constant, no value, and not a slice of a larger buffer."""
    if type(t) is not FakeTensor or t.fake_mode is not keeper.mode or t.constant is not None:
        return False
    if keeper.has_value(t) or t.layout != torch.strided or t.storage_offset() != 0:
        return False
    if t.is_conj() or t.is_neg() or t.untyped_storage()._cdata in inputs:
        return False
    return t.untyped_storage().nbytes() == _dense_bytes(t)


def _default_device() -> Any:
    get = getattr(torch._C, "_get_default_device", None)  # torch >= 2.3
    return get() if get is not None else None


def _dense_bytes(t: torch.Tensor) -> int:
    """The bytes `t`'s sizes and strides reach: what a storage made for it holds."""
    if t.numel() == 0:
        return 0
    reach = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return (1 + reach) * t.element_size()
