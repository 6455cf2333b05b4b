"""Attention-like softmaxes in forward: a softmax over the last dim of scores that a
matmul made. For each, whether a scale (1/sqrt(d): a division or multiplication by a
number) sits between the matmul and the softmax, and at initialisation how many rows put
more than 0.99 of their weight on one position (saturated: its gradients vanish)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from inspector.health.devices import user_caller

__all__ = ["AttentionSoftmax", "AttentionRecorder", "SATURATED_PROB"]

SATURATED_PROB = 0.99
_MATMULS = frozenset({"matmul", "bmm", "__matmul__", "einsum", "baddbmm"})
_SCALES = frozenset({"div", "mul", "__truediv__", "__mul__", "__rmul__", "true_divide",
                     "div_", "mul_", "__itruediv__", "__imul__"})  # fmt: skip
# Ops that pass the scores through unchanged in scale: masks, biases, views, casts.
_KEEPS = frozenset({
    "masked_fill", "masked_fill_", "add", "__add__", "__radd__", "add_", "where", "view",
    "reshape", "float", "to", "contiguous", "__getitem__", "type_as", "transpose", "permute",
    "sub", "__sub__",
})  # fmt: skip


@dataclass
class AttentionSoftmax:
    location: str | None  # "file.py:LINE" of the softmax in the user's code
    source_line: str | None
    scaled: bool  # a scale op between the scores' matmul and the softmax
    rows: int = 0
    saturated_rows: int = 0  # max probability > SATURATED_PROB (None-like 0 on fake)
    fake: bool = False  # no values: saturation unknown
    calls: int = 1
    shape: list[int] | None = None  # the probabilities' shape, first call
    bytes: int = 0  # the probabilities over all calls: what backward keeps of them


class AttentionRecorder(TorchFunctionMode):
    def __init__(self, user_files: Sequence[str]) -> None:
        super().__init__()
        self.user_files = list(user_files)
        self.scores: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> "raw"/"scaled"
        self.found: dict[str | None, AttentionSoftmax] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):  # noqa: ANN204
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        first = args[0] if args else kwargs.get("input")
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or not isinstance(first, torch.Tensor):
            return out
        if name in _MATMULS and out.dim() >= 3:
            self.scores[out] = "raw"
        elif first in self.scores and name in _SCALES and _by_number(args, kwargs):
            self.scores[out] = "scaled"
        elif first in self.scores and name in _KEEPS:
            self.scores[out] = self.scores[first]
        elif name == "softmax" and first in self.scores and _last_dim(args, kwargs, first):
            self._note(first, out)
        return out

    def _note(self, scores: torch.Tensor, probs: torch.Tensor) -> None:
        caller = user_caller(self.user_files)
        where, line = caller if caller else (None, None)
        fake = _is_fake(probs)
        rows = probs.numel() // max(probs.shape[-1], 1)
        size = probs.numel() * probs.element_size()
        saturated = 0 if fake else int((probs.detach().amax(-1) > SATURATED_PROB).sum())
        known = self.found.get(where)
        if known is not None:
            known.calls += 1
            known.rows += rows
            known.saturated_rows += saturated
            known.bytes += size
            return
        scaled = self.scores[scores] == "scaled"
        self.found[where] = AttentionSoftmax(
            where, line, scaled, rows, saturated, fake, shape=list(probs.shape), bytes=size
        )


def _by_number(args: Any, kwargs: dict) -> bool:
    """A scale by a Python number or a 0-dim tensor (not a mask or a bias)."""
    other = args[1] if len(args) > 1 else kwargs.get("other")
    return isinstance(other, int | float) or (isinstance(other, torch.Tensor) and other.dim() == 0)


def _last_dim(args: Any, kwargs: dict, x: torch.Tensor) -> bool:
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    return dim is not None and dim % x.dim() == x.dim() - 1


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) or t.is_meta
