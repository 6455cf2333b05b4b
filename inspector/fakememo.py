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

__all__ = ["FakeMemo"]

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
        flat_args = flat_arguments(args, kwargs)
        if flat_args is None:
            return None
        structure, flat = flat_args
        # what else the fake mode's own cache keys on: a default dtype or device may be
        # an output's, and inference tensors are another kind
        parts: list[Any] = [func, structure, torch.get_default_dtype(), _default_device()]
        parts.append(torch.is_inference_mode_enabled())
        tensors = 0
        for x in flat:
            if type(x) is FakeTensor:
                if x.fake_mode is not mode or x.constant is not None or self.has_value(x):
                    return None
                if x.layout != torch.strided:
                    return None
                parts.append((tuple(x.shape), x.stride(), x.dtype, x.storage_offset(),
                              x.fake_device, x.is_conj(), x.is_neg(), x.requires_grad))  # fmt: skip
                tensors += 1
            elif isinstance(x, torch.Tensor):  # real, or another subclass: its own rules
                return None
            elif isinstance(x, PLAIN_ARGUMENTS):
                parts.append((type(x), x))  # 1 and True and 1.0 are different arguments
            else:
                return None
        # A factory (no tensor argument) may be given a value (inspector.fakevalues)
        return tuple(parts) if tensors else None

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
        inputs = {
            x.untyped_storage()._cdata
            for x in (flat_arguments(args, kwargs) or ((), []))[1]
            if isinstance(x, torch.Tensor)
        }
        specs = []
        for t in outs:
            if type(t) is not FakeTensor or t.fake_mode is not self.mode or t.constant is not None:
                return
            if self.has_value(t) or t.layout != torch.strided or t.storage_offset() != 0:
                return
            if t.is_conj() or t.is_neg() or t.untyped_storage()._cdata in inputs:
                return
            if t.untyped_storage().nbytes() != _dense_bytes(t):  # a slice of a larger buffer
                return
            specs.append((tuple(t.shape), t.stride(), t.dtype, t.fake_device))
        self.outputs[key] = (isinstance(out, torch.Tensor), tuple(specs))


def _default_device() -> Any:
    get = getattr(torch._C, "_get_default_device", None)  # torch >= 2.3
    return get() if get is not None else None


def _dense_bytes(t: torch.Tensor) -> int:
    """The bytes `t`'s sizes and strides reach: what a storage made for it holds."""
    if t.numel() == 0:
        return 0
    reach = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return (1 + reach) * t.element_size()
