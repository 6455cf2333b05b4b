"""Plain view ops on fake tensors, made without the fake mode's dispatch.

A view allocates nothing: its output is the input's storage with new sizes and strides.
Yet every fake view pays the whole fake dispatch, mostly hashing its arguments for the
dispatch cache: about 100 us here, against 20 us for the meta kernel and a new fake
tensor. And views are many: the autograd engine detaches every saved tensor it unpacks
and every gradient it keeps, and each linear layer transposes its weight twice in its
backward. On a 1,000-node stack they are half of a fake training step's dispatches.

So a plain view of plain fake tensors runs its meta kernel here and is wrapped as the
fake mode's own cache would wrap it. Anything else takes the fake mode's whole path:
symbolic shapes, tensors with a constant or a real value (inspector.fakevalues), real
or foreign tensors, keyword arguments.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

from inspector.fakenew import FakeMaker

__all__ = ["PLAIN_VIEWS", "plain_view"]

_aten = torch.ops.aten
# Views with one tensor input and one output, whose meta kernel only restrides
PLAIN_VIEWS = frozenset({
    _aten.detach.default, _aten.alias.default, _aten.t.default, _aten.view.default,
    _aten.transpose.int, _aten.permute.default, _aten.expand.default,
    _aten.unsqueeze.default, _aten.squeeze.dim, _aten.squeeze.dims, _aten.slice.Tensor,
    _aten.select.int, _aten._unsafe_view.default,
})  # fmt: skip


def plain_view(
    maker: FakeMaker, func: Any, args: tuple, kwargs: dict, has_value: Any
) -> FakeTensor | None:
    """`func(*args)` (one of PLAIN_VIEWS) as a fake tensor of `maker`'s mode, or None where
    the fake mode's own dispatch must make it. `has_value(t)`: t carries a real value."""
    mode = maker.mode
    if kwargs or mode.shape_env is not None or getattr(mode, "propagate_real_tensors", False):
        return None
    source = args[0]
    if type(source) is not FakeTensor or source.fake_mode is not mode:
        return None
    if source.constant is not None or has_value(source):
        return None
    for arg in args[1:]:  # sizes, dims, indices, expand's flag: plain ints only
        if isinstance(arg, list | tuple):
            if not all(type(x) is int for x in arg):
                return None
        elif arg is not None and type(arg) not in (int, bool):
            return None
    with in_kernel_invocation_manager(mode):
        out = func(*args)
    return maker.new(out, source.fake_device)
