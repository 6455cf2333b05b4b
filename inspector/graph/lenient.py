"""Fake runs of models that read tensor values (`if h.sum() > 0:`).

A fake tensor has no values, so `bool()`/`.item()` raise. For shapes, any branch is as
good as another in the models we meet (both branches keep the shape), so while a fake
run is under way a scalar read returns a placeholder (True / 1 / 1.0) and is recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from inspector.dispatchmode import LeanDispatchMode
from inspector.fakevalues import new_fake_mode, value_of

__all__ = ["LenientScalars", "fake_context", "new_fake_mode"]


class LenientScalars(LeanDispatchMode):
    """Answers scalar reads of fake tensors with a placeholder; counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        # a fake tensor that carries its value answers it (inspector.fakevalues)
        scalar = func is torch.ops.aten._local_scalar_dense.default
        if scalar and _is_fake(args[0]) and value_of(args[0]) is None:
            self.reads += 1
            dtype = args[0].dtype
            return True if dtype == torch.bool else 1.0 if dtype.is_floating_point else 1
        return func(*args, **(kwargs or {}))


def _is_fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


@contextmanager
def fake_context(fake_mode: Any) -> Iterator[LenientScalars | None]:
    """Enter `fake_mode` (None: real run) with lenient scalar reads on top of it."""
    if fake_mode is None:
        with nullcontext():
            yield None
        return
    with fake_mode, LenientScalars() as lenient:
        yield lenient
