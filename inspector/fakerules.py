"""Fake ops whose outputs are shaped like their inputs, answered at any size by a rule.

The fake memo (inspector/fakememo.py) answers an op from a call with the same shapes. A
step at twice the batch, a model whose blocks change width, or a bf16 step misses it,
and a miss is dear where torch's fake kernel is a Python decomposition: a batch norm's
forward and backward take 2-3 ms each, an elementwise backward (hardswish's, gelu's)
about 1-2 ms. Those were 40% of mobilenet_v3_small's fake step at a new batch size.

For the ops here the shapes and strides of the outputs follow from the inputs' by a rule
written out below (an elementwise op's output is laid out like its inputs; a norm's
statistics are one per channel or per row). The rule is not trusted blindly: for each
key that leaves the sizes out (the op, each tensor's dtype, device, rank, which dims are
1 and whether it is laid out contiguous or channels-last, the other arguments as they
are), the first call takes the fake mode's whole path and the rule must give exactly
its outputs' shapes and strides; the outputs' dtypes are taken from that call. A key
where the rule and torch disagree is answered by torch from then on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, in_kernel_invocation_manager
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from inspector.fakenew import FakeMaker
from inspector.graph.metamemo import PLAIN_ARGUMENTS, flat_arguments, makes_new_tensors

__all__ = ["FakeRules", "RULES"]

_Layout = tuple[tuple[int, ...], tuple[int, ...]]  # (shape, strides)
_Rule = Callable[[tuple, dict], "list[_Layout | None]"]
_aten = torch.ops.aten


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides `torch.empty(shape)` has."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of `torch.empty(shape, memory_format=channels_last(_3d))`: channels
    innermost, then the spatial dims from the last, then the batch."""
    order = [1, *range(len(shape) - 1, 1, -1), 0]  # innermost first
    strides, step = [0] * len(shape), 1
    for dim in order:
        strides[dim] = step
        step *= max(shape[dim], 1)
    return tuple(strides)


def _layout_class(t: torch.Tensor) -> str | None:
    """ "c" or "cl" for a tensor laid out exactly as a new one of that memory format is,
    else None (a view with other strides: the rules below do not cover it)."""
    shape, stride = tuple(t.shape), t.stride()
    if stride == contiguous_strides(shape):
        return "c"
    if len(shape) in (4, 5) and stride == channels_last_strides(shape):
        return "cl"
    return None


def _like(t: torch.Tensor | None) -> _Layout | None:
    return None if t is None else (tuple(t.shape), t.stride())


def _vector(n: int) -> _Layout:
    return ((n,), (1,))


def _elementwise(args: tuple, kwargs: dict) -> list[_Layout | None]:
    """Every tensor argument of rank > 0 has one shape and strides: the output has them.
    (0-dim tensors broadcast and do not decide the layout.)"""
    tensors = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]
    ranked = [t for t in tensors if t.dim() > 0]
    first = ranked[0] if ranked else tensors[0]
    layout = _like(first)
    if any(_like(t) != layout for t in ranked):
        raise _NotCovered
    return [layout]


def _batch_norm(args: tuple, kwargs: dict) -> list[_Layout | None]:
    # (input, weight, bias, running_mean, running_var, training, momentum, eps)
    x, training = args[0], args[5]
    stats = _vector(x.shape[1] if training else 0)  # no statistics kept in eval (CPU)
    return [_like(x), stats, stats]


def _batch_norm_backward(args: tuple, kwargs: dict) -> list[_Layout | None]:
    # (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train,
    #  eps, output_mask)
    grad, x, mask = args[0], args[1], args[9]
    if _like(grad) != _like(x):
        raise _NotCovered
    channels = _vector(x.shape[1])
    return [_like(x) if mask[0] else None, *(channels if m else None for m in mask[1:])]


def _layer_norm(args: tuple, kwargs: dict) -> list[_Layout | None]:
    # (input, normalized_shape, weight, bias, eps): statistics per row, kept dims of 1
    x, k = args[0], len(args[1])
    shape = (*x.shape[: x.dim() - k], *(1,) * k)
    return [_like(x), (shape, contiguous_strides(shape)), (shape, contiguous_strides(shape))]


def _layer_norm_backward(args: tuple, kwargs: dict) -> list[_Layout | None]:
    # (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
    grad, x, weight, bias, mask = args[0], args[1], args[5], args[6], args[7]
    if _like(grad) != _like(x):
        raise _NotCovered
    return [
        _like(x) if mask[0] else None,
        _like(weight) if mask[1] else None,
        _like(bias) if mask[2] else None,
    ]


def _in_place(args: tuple, kwargs: dict) -> list[_Layout | None]:
    """An elementwise op that writes its first argument: the output is that tensor."""
    _elementwise(args, kwargs)  # the others laid out as it is, or 0-dim
    return _SELF


_SELF: list[_Layout | None] = []  # the rule's answer: the first argument itself


def _first_like(args: tuple, kwargs: dict) -> list[_Layout | None]:
    """Softmax and its backward: the first tensor's layout."""
    return [_like(args[0])]


class _NotCovered(Exception):
    """The call's arguments are outside its rule (shapes that broadcast, say)."""


# Elementwise ops that torch does not tag pointwise, whose fake kernels are decompositions
_UNTAGGED_ELEMENTWISE = (
    "hardswish", "hardswish_backward", "hardsigmoid", "hardsigmoid_backward",
    "hardtanh_backward", "elu_backward", "leaky_relu_backward", "softplus_backward",
    "mish_backward", "logit_backward",
)  # fmt: skip
_UNTAGGED_IN_PLACE = ("hardswish_", "hardsigmoid_", "mish_", "silu_")

RULES: dict[Any, _Rule] = {
    _aten.native_batch_norm.default: _batch_norm,
    _aten.native_batch_norm_backward.default: _batch_norm_backward,
    _aten.native_layer_norm.default: _layer_norm,
    _aten.native_layer_norm_backward.default: _layer_norm_backward,
    _aten._softmax.default: _first_like,
    _aten._log_softmax.default: _first_like,
    _aten._softmax_backward_data.default: _first_like,
    _aten._log_softmax_backward_data.default: _first_like,
}
for _names, _kind in ((_UNTAGGED_ELEMENTWISE, _elementwise), (_UNTAGGED_IN_PLACE, _in_place)):
    for _name in _names:
        _packet = getattr(_aten, _name, None)
        if _packet is not None and hasattr(_packet, "default"):
            RULES[_packet.default] = _kind


def _rule(func: Any) -> _Rule | None:
    known = RULES.get(func, _UNKNOWN)
    if known is _UNKNOWN:  # a pointwise op that makes a new tensor or writes its first
        known = RULES[func] = _pointwise_rule(func)
    return known


def _pointwise_rule(func: Any) -> _Rule | None:
    if not isinstance(func, torch._ops.OpOverload) or torch.Tag.pointwise not in func.tags:
        return None
    if makes_new_tensors(func):
        return _elementwise
    return _in_place if _writes_first_only(func) else None


def _writes_first_only(func: Any) -> bool:
    """`f_(Tensor(a!) self, ...) -> Tensor(a!)`: writes its first argument, returns it."""
    schema = func._schema
    arguments, returns = schema.arguments, schema.returns
    if not arguments or len(returns) != 1 or returns[0].alias_info is None:
        return False
    written = [a.name for a in arguments if a.alias_info is not None and a.alias_info.is_write]
    first = arguments[0].alias_info
    return written == [arguments[0].name] and returns[0].alias_info.before_set == first.before_set


_UNKNOWN = object()


class FakeRules:
    """Per fake mode: size-free key -> the outputs' dtypes (or None: torch answers)."""

    def __init__(self, mode: FakeTensorMode, has_value: Any, maker: FakeMaker) -> None:
        self.mode = mode
        self.has_value = has_value  # t -> whether it carries a real value
        self.maker = maker
        self.dtypes: dict[tuple, tuple[torch.dtype | None, ...] | None] = {}
        self.hits = 0

    def key(self, func: Any, args: tuple, kwargs: dict) -> tuple | None:
        """The size-free key of this call, or None where no rule covers it."""
        mode = self.mode
        if mode.shape_env is not None or getattr(mode, "propagate_real_tensors", False):
            return None
        if _rule(func) is None or get_proxy_mode() is not None:
            return None
        flat_args = flat_arguments(args, kwargs)
        if flat_args is None:
            return None
        structure, flat = flat_args
        parts: list[Any] = [func, structure, torch.get_default_dtype()]
        parts.append(torch.is_inference_mode_enabled())
        tensors = 0
        for x in flat:
            if type(x) is FakeTensor:
                if x.fake_mode is not mode or x.constant is not None or self.has_value(x):
                    return None
                if x.layout != torch.strided or x.storage_offset() != 0 or x.numel() == 0:
                    return None
                if x.is_conj() or x.is_neg():
                    return None
                layout = _layout_class(x)
                if layout is None:
                    return None
                ones = tuple(size == 1 for size in x.shape)
                parts.append((x.dtype, x.fake_device, ones, layout, x.requires_grad))
                tensors += 1
            elif isinstance(x, torch.Tensor):  # real, or another subclass: its own rules
                return None
            elif isinstance(x, PLAIN_ARGUMENTS):
                parts.append((type(x), x))  # 1 and True and 1.0 are different arguments
            else:
                return None
        return tuple(parts) if tensors else None

    def answer(self, key: tuple, func: Any, args: tuple, kwargs: dict) -> Any:
        """Fresh outputs by the rule where this key's first call agreed with it (an op that
        writes its first argument: that argument), else None."""
        dtypes = self.dtypes.get(key)
        if dtypes is None:
            return None
        try:
            layouts = _rule(func)(args, kwargs)
        except _NotCovered:
            return None
        self.hits += 1
        if layouts is _SELF:
            return args[0]
        device = next(x for x in flat_arguments(args, kwargs)[1] if type(x) is FakeTensor)
        return self._make(layouts, dtypes, device.fake_device)

    def _make(self, layouts: list[_Layout | None], dtypes: tuple, device: torch.device) -> Any:
        with in_kernel_invocation_manager(self.mode):
            metas = [
                None if layout is None else torch.empty_strided(*layout, dtype=dtype, device="meta")
                for layout, dtype in zip(layouts, dtypes, strict=True)
            ]
        outs = tuple(None if m is None else self.maker.new(m, device) for m in metas)
        return outs[0] if len(outs) == 1 else outs

    def remember(self, key: tuple, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """After the whole path: keep the outputs' dtypes when the rule gives exactly their
        shapes and strides, each a new fake tensor owning its storage; else mark the key
        as torch's."""
        if key in self.dtypes:
            return
        self.dtypes[key] = None
        try:
            layouts = _rule(func)(args, kwargs)
        except _NotCovered:
            del self.dtypes[key]  # another call of this key may be covered
            return
        if layouts is _SELF:  # the fake mode handed back the very tensor it wrote
            if out is args[0]:
                self.dtypes[key] = ()
            return
        outs = (out,) if isinstance(out, torch.Tensor) else out
        if not isinstance(outs, tuple) or len(outs) != len(layouts):
            return
        inputs = {
            x.untyped_storage()._cdata
            for x in flat_arguments(args, kwargs)[1]
            if isinstance(x, torch.Tensor)
        }
        device = next(x for x in flat_arguments(args, kwargs)[1] if type(x) is FakeTensor)
        dtypes = []
        for t, layout in zip(outs, layouts, strict=True):
            if t is None or layout is None:
                if t is not None or layout is not None:
                    return
                dtypes.append(None)
                continue
            if type(t) is not FakeTensor or t.fake_mode is not self.mode or t.constant is not None:
                return
            if self.has_value(t) or t.layout != torch.strided or t.storage_offset() != 0:
                return
            if t.is_conj() or t.is_neg() or t.untyped_storage()._cdata in inputs:
                return
            if t.fake_device != device.fake_device or (tuple(t.shape), t.stride()) != layout:
                return
            if t.untyped_storage().nbytes() != t.numel() * t.element_size():
                return
            dtypes.append(t.dtype)
        self.dtypes[key] = tuple(dtypes)
