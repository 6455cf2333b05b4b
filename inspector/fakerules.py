"""Fake ops answered at any size by a rule for their outputs' shapes and strides.

The fake memo (inspector/fakememo.py) answers an op from a call with the same shapes. A
step at twice the batch, a model whose blocks change width, or a bf16 step misses it,
and a miss is dear where torch's fake kernel is Python: a batch norm's forward and
backward take 2-3 ms each, an elementwise backward (hardswish's, gelu's) 1-2 ms, a
convolution's 0.5 ms. mobilenet_v3_small's fake forward and backward at a new batch
took 0.47 s against 0.07 s from the cache; with these rules, 0.09 s.

The rules, written out below: an elementwise op's output has the shape its inputs
broadcast to and the layout of those already of that shape; a norm keeps one statistic
per channel or per row; a convolution's output size is its arithmetic; a reduction
drops or keeps its dims; a matrix product is a new contiguous [rows, columns].

A rule is not trusted blindly. The key leaves out the sizes and nothing else: the op,
the other arguments as they are, and per tensor its dtype, device, which dims are 1,
and its layout (contiguous, channels-last, or else the order of its strides). The first
call of each key takes the fake mode's whole path, and the rule must give exactly its
outputs' shapes and strides; the outputs' dtypes are taken from that call. A key where
the rule and torch disagree is torch's from then on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, in_kernel_invocation_manager
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from inspector.fakememo import fresh_output, input_storages, plain_fake_key
from inspector.fakenew import FakeMaker
from inspector.graph.metamemo import flat_arguments, makes_new_tensors

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
    """Whether `t` is laid out exactly as a new tensor is: "c" (contiguous), "cl"
    (channels-last), else None (a view with other strides)."""
    shape, stride = tuple(t.shape), t.stride()
    if stride == contiguous_strides(shape):
        return "c"
    if len(shape) in (4, 5) and stride == channels_last_strides(shape):
        return "cl"
    return None


def _strides_order(t: torch.Tensor) -> tuple:
    """What the key says of a tensor laid out otherwise: its dims from the largest stride
    to the smallest, and which are broadcast (stride 0)."""
    stride = t.stride()
    order = tuple(sorted(range(t.dim()), key=lambda d: (-stride[d], d)))
    return order, tuple(s == 0 for s in stride)


def _size_free(x: FakeTensor) -> tuple | None:
    """What the key says of a tensor: all but its sizes (None: no rule covers it, as for
    symbolic sizes, whose arithmetic is the shape environment's)."""
    if x._has_symbolic_sizes_strides:
        return None
    if x.storage_offset() != 0 or x.numel() == 0 or x.is_conj() or x.is_neg():
        return None
    layout = _layout_class(x) or _strides_order(x)
    return x.dtype, x.fake_device, tuple(size == 1 for size in x.shape), layout, x.requires_grad


def _like(t: torch.Tensor | None) -> _Layout | None:
    """The layout of `t`, which must be one a new tensor has (a view's strides are not
    carried over by every kernel)."""
    if t is None:
        return None
    if _layout_class(t) is None:
        raise _NotCovered
    return tuple(t.shape), t.stride()


def _vector(n: int) -> _Layout:
    return ((n,), (1,))


def _elementwise(args: tuple, kwargs: dict) -> list[_Layout | None]:
    """The tensor arguments broadcast to one shape: the output has the layout of those
    already of that shape (which must agree), or is contiguous where every tensor is."""
    tensors = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]
    try:
        shape = tuple(torch.broadcast_shapes(*(t.shape for t in tensors)))
    except RuntimeError:
        raise _NotCovered from None  # torch says why
    full = {_like(t) for t in tensors if tuple(t.shape) == shape}
    if len(full) > 1:
        raise _NotCovered
    if any(tuple(t.shape) != shape and _layout_class(t) != "c" for t in tensors):
        raise _NotCovered
    return [full.pop() if full else (shape, contiguous_strides(shape))]


def _reduction(args: tuple, kwargs: dict) -> list[_Layout | None]:
    """sum / mean / amax over dims: those dims gone, or kept as 1; contiguous."""
    x = args[0]
    if _layout_class(x) is None:
        raise _NotCovered
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    rank = x.dim()
    if isinstance(dims, int):
        dims = [dims]
    reduced = {d % rank for d in dims} if dims and rank else set(range(rank))
    shape = tuple(
        1 if i in reduced else size for i, size in enumerate(x.shape) if keepdim or i not in reduced
    )
    return [(shape, contiguous_strides(shape))]


def _batch_norm(args: tuple, kwargs: dict) -> list[_Layout | None]:
    # (input, weight, bias, running_mean, running_var, training, momentum, eps)
    x, training = args[0], args[5]
    _per_channel(x, args[1:5])
    stats = _vector(x.shape[1] if training else 0)  # no statistics kept in eval (CPU)
    return [_like(x), stats, stats]


def _batch_norm_no_training(args: tuple, kwargs: dict) -> list[_Layout | None]:
    # (input, weight, bias, running_mean, running_var, momentum, eps): a batch norm in
    # eval, as an export traces it
    return _batch_norm((*args[:5], False, *args[5:]), kwargs)


def _per_channel(x: torch.Tensor, tensors: tuple) -> None:
    """A batch norm's weight, bias and statistics hold one value per channel of `x`; a
    call where they do not is torch's to refuse."""
    if x.dim() < 2 or any(t is not None and tuple(t.shape) != (x.shape[1],) for t in tensors):
        raise _NotCovered


def _batch_norm_backward(args: tuple, kwargs: dict) -> list[_Layout | None]:
    # (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train,
    #  eps, output_mask)
    grad, x, mask = args[0], args[1], args[9]
    _per_channel(x, args[2:7])
    if _like(grad) != _like(x):
        raise _NotCovered
    channels = _vector(x.shape[1])
    return [_like(x) if mask[0] else None, *(channels if m else None for m in mask[1:])]


def _layer_norm(args: tuple, kwargs: dict) -> list[_Layout | None]:
    # (input, normalized_shape, weight, bias, eps): statistics per row, kept dims of 1
    x, k = args[0], len(args[1])
    _normalized(x, args[1], args[2:4])
    shape = (*x.shape[: x.dim() - k], *(1,) * k)
    return [_like(x), (shape, contiguous_strides(shape)), (shape, contiguous_strides(shape))]


def _layer_norm_backward(args: tuple, kwargs: dict) -> list[_Layout | None]:
    # (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
    grad, x, weight, bias, mask = args[0], args[1], args[5], args[6], args[7]
    _normalized(x, args[2], (weight, bias))
    if _like(grad) != _like(x):
        raise _NotCovered
    return [
        _like(x) if mask[0] else None,
        _like(weight) if mask[1] else None,
        _like(bias) if mask[2] else None,
    ]


def _normalized(x: torch.Tensor, shape: list, tensors: tuple) -> None:
    """A layer norm normalizes `x`'s last dims, of `shape`, as its weight and bias are."""
    k = len(shape)
    if not 0 < k <= x.dim() or tuple(x.shape[x.dim() - k :]) != tuple(shape):
        raise _NotCovered
    if any(t is not None and tuple(t.shape) != tuple(shape) for t in tensors):
        raise _NotCovered


def _laid_out(shape: tuple[int, ...], *like: torch.Tensor) -> _Layout:
    """`shape` channels-last where a tensor of `like` is (a convolution's rule), else
    contiguous."""
    if len(shape) in (4, 5) and any(_layout_class(t) == "cl" for t in like):
        return shape, channels_last_strides(shape)
    return shape, contiguous_strides(shape)


def _convolution(args: tuple, kwargs: dict) -> list[_Layout | None]:
    # (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    x, w, _, stride, padding, dilation, transposed, output_padding, groups = args
    spatial = x.dim() - 2
    if w.dim() != x.dim() or spatial < 1 or kwargs or None in (_layout_class(x), _layout_class(w)):
        raise _NotCovered
    stride, padding, dilation, output_padding = (
        _per_dim(v, spatial) for v in (stride, padding, dilation, output_padding)
    )
    sizes = []
    for i in range(spatial):
        reach = dilation[i] * (w.shape[2 + i] - 1)
        if transposed:
            size = (x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + reach + output_padding[i] + 1
        else:
            size = (x.shape[2 + i] + 2 * padding[i] - reach - 1) // stride[i] + 1
        if size < 1:
            raise _NotCovered  # torch says why
        sizes.append(size)
    _conv_channels(x, w, transposed, groups)
    channels = w.shape[1] * groups if transposed else w.shape[0]
    return [_laid_out((x.shape[0], channels, *sizes), x, w)]


def _conv_channels(x: torch.Tensor, w: torch.Tensor, transposed: bool, groups: int) -> None:
    """The input has the channels the weight takes; else torch refuses the call."""
    taken = w.shape[0] if transposed else w.shape[1] * groups
    if groups < 1 or x.shape[1] != taken or w.shape[0] % groups:
        raise _NotCovered


def _convolution_backward(args: tuple, kwargs: dict) -> list[_Layout | None]:
    # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    #  output_padding, groups, output_mask)
    x, w, bias_sizes, mask = args[1], args[2], args[3], args[10]
    if kwargs or (mask[2] and not bias_sizes) or None in (_layout_class(x), _layout_class(w)):
        raise _NotCovered
    _conv_channels(x, w, args[7], args[9])
    return [
        _laid_out(tuple(x.shape), x, w) if mask[0] else None,
        _laid_out(tuple(w.shape), x, w) if mask[1] else None,
        _vector(bias_sizes[0]) if mask[2] else None,
    ]


def _per_dim(value: Any, dims: int) -> list[int]:
    values = list(value) if isinstance(value, list | tuple) else [value]
    if len(values) == 1:
        values *= dims
    if len(values) != dims:
        raise _NotCovered
    return values


def _in_place(args: tuple, kwargs: dict) -> list[_Layout | None]:
    """An elementwise op that writes its first argument: the output is that tensor (the
    others broadcast to its shape)."""
    if _elementwise(args, kwargs)[0][0] != tuple(args[0].shape):
        raise _NotCovered
    return _SELF


_SELF: list[_Layout | None] = []  # the rule's answer: the first argument itself


def _mm(args: tuple, kwargs: dict) -> list[_Layout | None]:
    """mm and bmm: a new contiguous [..., rows of a, columns of b], whatever the
    operands' strides (a weight comes transposed)."""
    return [_product(args[0], args[1])]


def _addmm(args: tuple, kwargs: dict) -> list[_Layout | None]:
    """addmm(bias, a, b): as `_mm` of a and b, the bias broadcast to it."""
    layout = _product(args[1], args[2])
    try:
        fits = tuple(torch.broadcast_shapes(args[0].shape, layout[0])) == layout[0]
    except RuntimeError:
        fits = False
    if not fits:
        raise _NotCovered
    return [layout]


def _product(a: torch.Tensor, b: torch.Tensor) -> _Layout:
    if a.dim() != b.dim() or a.shape[-1] != b.shape[-2] or a.shape[:-2] != b.shape[:-2]:
        raise _NotCovered  # torch says why
    shape = (*a.shape[:-1], b.shape[-1])
    return shape, contiguous_strides(shape)


def _first_like(args: tuple, kwargs: dict) -> list[_Layout | None]:
    """The first tensor's layout (softmax, the `*_like` factories)."""
    return [_like(args[0])]


def _softmax_backward(args: tuple, kwargs: dict) -> list[_Layout | None]:
    """(grad_output, output, dim, input_dtype): both of one layout, which it has."""
    if _like(args[0]) != _like(args[1]):
        raise _NotCovered
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
    _aten.convolution.default: _convolution,
    _aten.convolution_backward.default: _convolution_backward,
    _aten.native_batch_norm.default: _batch_norm,
    _aten._native_batch_norm_legit.default: _batch_norm,  # as Dynamo's trace calls it
    _aten._native_batch_norm_legit_no_training.default: _batch_norm_no_training,
    _aten.native_batch_norm_backward.default: _batch_norm_backward,
    _aten.native_layer_norm.default: _layer_norm,
    _aten.native_layer_norm_backward.default: _layer_norm_backward,
    # a new tensor like the first (memory_format's default preserves its layout)
    _aten.empty_like.default: _first_like,
    _aten.zeros_like.default: _first_like,
    _aten.ones_like.default: _first_like,
    _aten.full_like.default: _first_like,
    _aten.mm.default: _mm,
    _aten.addmm.default: _addmm,
    _aten.bmm.default: _mm,
    _aten.sum.dim_IntList: _reduction,
    _aten.mean.dim: _reduction,
    _aten.amax.default: _reduction,
    _aten.amin.default: _reduction,
    _aten._softmax.default: _first_like,
    _aten._log_softmax.default: _first_like,
    _aten._softmax_backward_data.default: _softmax_backward,
    _aten._log_softmax_backward_data.default: _softmax_backward,
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


def _device(args: tuple, kwargs: dict) -> torch.device:
    """The device the call's fake tensors claim (the key holds one per tensor)."""
    return next(x for x in flat_arguments(args, kwargs)[1] if type(x) is FakeTensor).fake_device


class FakeRules:
    """Per fake mode: size-free key -> the outputs' dtypes (or None: torch answers).

    `learned`: that table, where modes share it (the key names no mode). `in_shape_env`:
    answer a mode with a shape environment too (Dynamo's), its calls whose tensors have
    no symbolic size; a symbolic one takes the mode's whole path, guards and all."""

    def __init__(
        self,
        mode: FakeTensorMode,
        has_value: Any,
        maker: FakeMaker,
        learned: dict[tuple, tuple[torch.dtype | None, ...] | None] | None = None,
        in_shape_env: bool = False,
    ) -> None:
        self.mode = mode
        self.has_value = has_value  # t -> whether it carries a real value
        self.maker = maker
        self.dtypes = {} if learned is None else learned
        self.in_shape_env = in_shape_env
        self.hits = 0

    def key(self, func: Any, args: tuple, kwargs: dict) -> tuple | None:
        """The size-free key of this call, or None where no rule covers it."""
        mode = self.mode
        if mode.shape_env is not None and not self.in_shape_env:
            return None
        if getattr(mode, "propagate_real_tensors", False):
            return None
        if _rule(func) is None or get_proxy_mode() is not None:
            return None
        head = [torch.get_default_dtype(), torch.is_inference_mode_enabled()]
        return plain_fake_key(self, func, args, kwargs, head, _size_free)

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
        return self._make(layouts, dtypes, _device(args, kwargs))

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
        inputs = input_storages(args, kwargs)
        device = _device(args, kwargs)
        dtypes = []
        for t, layout in zip(outs, layouts, strict=True):
            if t is None or layout is None:
                if t is not None or layout is not None:
                    return
                dtypes.append(None)
                continue
            if not fresh_output(self, t, inputs) or t.fake_device != device:
                return
            if (tuple(t.shape), t.stride()) != layout:
                return
            dtypes.append(t.dtype)
        self.dtypes[key] = tuple(dtypes)
