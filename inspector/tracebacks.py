"""The user's frames of an exception: where in *their* code something went wrong."""

from __future__ import annotations

import inspect
import linecache
import os
import traceback
from collections.abc import Iterable

from torch import nn

__all__ = [
    "user_frames",
    "user_location",
    "format_user_traceback",
    "is_user_file",
    "runs_user_code",
    "inspector_fault",
    "INTERNAL_NOTE",
]

_PACKAGE = os.path.dirname(os.path.realpath(__file__)) + os.sep
# how a section says that the inspector, not the model, failed
INTERNAL_NOTE = "an internal error of the inspector, not a fault of the model; please report it"


def inspector_fault(exc: BaseException) -> bool:
    """Whether `exc` was raised by the inspector's own code (a hook, a graph replay, a
    traced value left behind), not by the model, its libraries or torch."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and os.path.realpath(frames[-1].filename).startswith(_PACKAGE)


def is_user_file(filename: str, user_files: Iterable[str]) -> bool:
    filename = os.path.realpath(filename)
    for user in user_files:
        user = os.path.realpath(user)
        if filename == user or filename.startswith(user.rstrip(os.sep) + os.sep):
            return True
    return False


def runs_user_code(model: nn.Module, user_files: Iterable[str]) -> bool:
    """Whether the model's forward can reach the user's files: some module of it has its
    class defined there. A model built only from library classes (Hugging Face from a
    config) never puts a user frame on the stack, so tracing need not record stacks."""
    files = list(user_files)
    for module in model.modules():
        try:
            source = inspect.getsourcefile(type(module))
        except TypeError:  # a class defined in C or at the prompt
            continue
        if source and is_user_file(source, files):
            return True
    return False


def user_frames(exc: BaseException, user_files: Iterable[str]) -> list[traceback.FrameSummary]:
    """Frames of `exc`'s traceback (following its cause chain) that lie in the user's
    files or folders, innermost last."""
    user_files = list(user_files)
    frames: list[traceback.FrameSummary] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for frame in traceback.extract_tb(current.__traceback__):
            if is_user_file(frame.filename, user_files):
                frames.append(frame)
        current = current.__cause__ or current.__context__
    return frames


def user_location(exc: BaseException, user_files: Iterable[str]) -> tuple[str, str] | None:
    """("file.py:LINE", source line) of the innermost user frame, or None."""
    frames = user_frames(exc, user_files)
    if not frames:
        return None
    frame = frames[-1]
    line = frame.line or linecache.getline(frame.filename, frame.lineno or 0).strip()
    return f"{os.path.basename(frame.filename)}:{frame.lineno}", line


def format_user_traceback(exc: BaseException, user_files: Iterable[str]) -> str:
    """A traceback with only the user's frames, then the exception line."""
    frames = user_frames(exc, user_files)
    lines = ["Traceback (your code, most recent call last):\n"]
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)
