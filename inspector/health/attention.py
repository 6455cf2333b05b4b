"""Attention-like softmaxes in forward: a softmax over the last dim of scores that a
matmul made. For each, whether the scores are scaled (1/sqrt(d): a division or
multiplication by a number between the matmul and the softmax, or on a matmul operand
before it, as torchvision's Swin scales q; or operands L2-normalised, cosine attention),
and at initialisation how many rows put more than 0.99 of their weight on one position
(saturated: its gradients vanish)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from inspector.health.devices import user_caller

__all__ = ["AttentionSoftmax", "AttentionRecorder", "SATURATED_PROB", "MATMULS"]

SATURATED_PROB = 0.99
MATMULS = frozenset({"matmul", "bmm", "__matmul__", "einsum", "baddbmm"})  # make the scores
_SCALES = frozenset({"div", "mul", "__truediv__", "__mul__", "__rmul__", "true_divide",
                     "div_", "mul_", "__itruediv__", "__imul__"})  # fmt: skip
# Ops that pass the scores through unchanged in scale: masks, biases, views, casts.
_KEEPS = frozenset({
    "masked_fill", "masked_fill_", "add", "__add__", "__radd__", "add_", "where", "view",
    "reshape", "float", "to", "contiguous", "__getitem__", "type_as", "transpose", "permute",
    "sub", "__sub__",
})  # fmt: skip
# Ops that keep a matmul operand's scale (q scaled, then split into heads).
_VIEWS = frozenset({"view", "reshape", "transpose", "permute", "contiguous", "__getitem__",
                    "float", "to", "type_as", "unsqueeze", "squeeze", "flatten"})  # fmt: skip


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
        self.prescaled: WeakIdKeyDictionary = WeakIdKeyDictionary()  # operands scaled first
        self.found: dict[str | None, AttentionSoftmax] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):  # noqa: ANN204
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        first = args[0] if args else kwargs.get("input")
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or not isinstance(first, torch.Tensor):
            return out
        if name in MATMULS and out.dim() >= 3:
            operands = [a for a in args if isinstance(a, torch.Tensor)]
            prescaled = any(a in self.prescaled for a in operands)
            self.scores[out] = "scaled" if prescaled or _alpha_scales(kwargs) else "raw"
        elif self._prescales(name, first, args, kwargs):
            self.prescaled[out] = True
        elif first in self.scores and name in _SCALES and _by_number(args, kwargs):
            self.scores[out] = "scaled"
        elif first in self.scores and name in _KEEPS:
            self.scores[out] = self.scores[first]
        elif name == "softmax" and first in self.scores and _last_dim(args, kwargs, first):
            self._note(first, out)
        return out

    def _prescales(self, name: str, first: torch.Tensor, args: Any, kwargs: dict) -> bool:
        """A future matmul operand scaled (q * d**-0.5, F.normalize(q)), or a view of one."""
        if first in self.prescaled:
            return name in _VIEWS
        if first in self.scores:
            return False  # a scale after the matmul: the branch below
        if name == "normalize":
            return True
        return name in _SCALES and _by_number(args, kwargs) and _shrinks(name, args, kwargs)

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


def _alpha_scales(kwargs: dict) -> bool:
    """`baddbmm(bias, q, k, alpha=1/sqrt(d))` scales the product itself (BLOOM's ALiBi
    attention): an alpha that shrinks, as the scale does."""
    alpha = kwargs.get("alpha", 1)
    return isinstance(alpha, (int, float)) and 0 < abs(alpha) < 1


def _by_number(args: Any, kwargs: dict) -> bool:
    """A scale by a Python number, a 0-dim tensor or one number per head (a tensor whose
    last two dims are 1, Swin V2's logit scale): not a mask or a bias."""
    other = args[1] if len(args) > 1 else kwargs.get("other")
    if isinstance(other, int | float):
        return True
    if not isinstance(other, torch.Tensor):
        return False
    return other.dim() == 0 or (other.dim() >= 2 and other.shape[-2:] == (1, 1))


def _shrinks(name: str, args: Any, kwargs: dict) -> bool:
    """A scale that makes values smaller, as 1/sqrt(d) does (q * 1.0 or q * 100 is not
    one); a tensor scale counts (its value may be a learned or a fake one)."""
    other = args[1] if len(args) > 1 else kwargs.get("other")
    if not isinstance(other, int | float):
        return True
    factor = 1 / other if "div" in name and other else other
    return abs(factor) < 1


def _last_dim(args: Any, kwargs: dict, x: torch.Tensor) -> bool:
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    return dim is not None and dim % x.dim() == x.dim() - 1


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) or t.is_meta
