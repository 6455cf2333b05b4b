"""Tensors that the user's forward puts on a fixed device: `.cuda()`, `.cpu()`,
`.to("cuda")`, `device="cpu"` written out, or a factory (`torch.arange(n)`) given no
device at all. They work on the machine they were written on and break (or copy every
step) as soon as the model moves. Only calls made directly by the user's code count:
a library's own factories are the library's business."""

from __future__ import annotations

import linecache
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from inspector.health.locate import _SKIP, is_user_file

__all__ = ["FixedDevice", "DeviceRecorder", "direct_user_caller", "user_caller"]

FACTORIES = frozenset({
    "zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "eye", "tensor",
    "rand", "randn", "randint", "randperm", "as_tensor", "tril_indices", "triu_indices",
})  # fmt: skip
_MOVES = frozenset({"cuda", "cpu"})


@dataclass
class FixedDevice:
    how: str  # ".cuda()", ".to('cuda')", "device='cpu'", "no device"
    op: str  # the torch function: arange, cuda, to...
    location: str  # "file.py:LINE"
    source_line: str | None = None


class DeviceRecorder(TorchFunctionMode):
    def __init__(self, user_files: Sequence[str]) -> None:
        super().__init__()
        self.user_files = list(user_files)
        self.found: dict[str, FixedDevice] = {}  # by location: one per line

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):  # noqa: ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        how = _fixed(getattr(func, "__name__", ""), args, kwargs, out)
        if how is not None:
            self._note(how, getattr(func, "__name__", ""))
        return out

    def _note(self, how: str, op: str) -> None:
        caller = direct_user_caller(self.user_files)
        if caller is not None:
            where, line = caller
            self.found.setdefault(where, FixedDevice(how, op, where, line))


def _fixed(name: str, args: Any, kwargs: dict, out: Any) -> str | None:
    if not isinstance(out, torch.Tensor):
        return None
    if name in _MOVES and args and isinstance(args[0], torch.Tensor):
        return f".{name}()"
    if name == "to":
        target = kwargs.get("device", args[1] if len(args) > 1 else None)
        return f".to({target!r})" if isinstance(target, str) else None
    if name in FACTORIES:
        device = kwargs.get("device")
        if isinstance(device, str):
            return f"device={device!r}"
        # a 0-dim CPU tensor mixes with tensors on any device: only sized ones break
        if device is None and out.dim() > 0:
            return "no device"
    return None


def user_caller(
    user_files: Sequence[str], frame: FrameType | None = None
) -> tuple[str, str | None] | None:
    """("file.py:LINE", its text) of the innermost frame outside torch, the inspector and
    the standard library (from `frame`, else the caller's), when that frame is the user's
    (None: a library made the call)."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        path = os.path.realpath(frame.f_code.co_filename)
        if not path.startswith(_SKIP) and not frame.f_code.co_filename.startswith("<"):
            break
        frame = frame.f_back
    if frame is None or not user_files or not is_user_file(frame.f_code.co_filename, user_files):
        return None
    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    return where, linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip() or None


_TORCH = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep
_INSPECTOR = os.path.realpath(os.path.dirname(os.path.dirname(__file__))) + os.sep


def direct_user_caller(user_files: Sequence[str]) -> tuple[str, str | None] | None:
    """As `user_caller`, but only where the user's own line made the call: the ops
    recorded here (`.cpu()`, `.to(...)`, factories) are C functions, called straight from
    the code that wrote them. Where that code is torch's own (`pad_packed_sequence` puts
    its lengths on the CPU by contract; a torch module's internals), it is torch's
    business, not a line of the user's to change."""
    frame = sys._getframe(1)
    while frame is not None and os.path.realpath(frame.f_code.co_filename).startswith(_INSPECTOR):
        frame = frame.f_back  # the recording mode's own frames
    if frame is None or os.path.realpath(frame.f_code.co_filename).startswith(_TORCH):
        return None
    return user_caller(user_files, frame)
