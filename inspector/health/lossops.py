"""What the loss is computed from: one forward and the loss under a TorchFunctionMode that
remembers which op made each tensor (softmax, log_softmax, sigmoid, through views), and
each loss function called with the op that made its input and the user's line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from inspector.health.locate import user_location

__all__ = ["LossCall", "LossRecorder", "LOSSES", "PRODUCERS"]

# The ops whose output a loss cares about, and the losses that care.
PRODUCERS = frozenset({"softmax", "log_softmax", "sigmoid", "log", "logsigmoid"})
LOSSES = frozenset({"cross_entropy", "nll_loss", "binary_cross_entropy"})
# Ops that keep the values (and so the producer) of their first input.
_KEEPS = frozenset({
    "view", "reshape", "flatten", "permute", "transpose", "contiguous", "squeeze",
    "unsqueeze", "__getitem__", "float", "to", "type_as", "clone", "view_as", "select",
})  # fmt: skip


@dataclass
class LossCall:
    loss: str  # cross_entropy, nll_loss, binary_cross_entropy
    input_from: str | None  # the op that made its input (None: not one of PRODUCERS)
    location: str | None  # "file.py:LINE" of the call in the user's code
    source_line: str | None = None


class LossRecorder(TorchFunctionMode):
    def __init__(self, user_files: Sequence[str]) -> None:
        super().__init__()
        self.user_files = list(user_files)
        self.made_by: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.calls: list[LossCall] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):  # noqa: ANN204
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        first = args[0] if args else kwargs.get("input")
        if name in LOSSES and isinstance(first, torch.Tensor):
            found = user_location(self.user_files, skip=2)
            where, line = found if found else (None, None)
            self.calls.append(LossCall(name, self.made_by.get(first), where, line))
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            if name in PRODUCERS:
                self.made_by[out] = name
            elif name in _KEEPS and isinstance(first, torch.Tensor) and first in self.made_by:
                self.made_by[out] = self.made_by[first]
        return out
