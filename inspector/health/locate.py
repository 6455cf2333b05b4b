"""Where in the user's code the forward is: the innermost frame outside torch and us."""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Sequence

import torch

import inspector

__all__ = ["user_location", "is_user_file"]

_SKIP = tuple(
    os.path.realpath(p) + os.sep
    for p in (
        os.path.dirname(torch.__file__),
        os.path.dirname(inspector.__file__),
        sysconfig.get_paths()["stdlib"],
    )
)


def is_user_file(filename: str, user_files: Sequence[str]) -> bool:
    path = os.path.realpath(filename)
    if user_files:
        return any(
            path == os.path.realpath(u) or path.startswith(u.rstrip(os.sep) + os.sep)
            for u in user_files
        )
    return not path.startswith(_SKIP) and not filename.startswith("<")


def user_location(user_files: Sequence[str] = (), skip: int = 1) -> tuple[str, str] | None:
    """("file.py:LINE", source line) of the innermost user frame on the current stack."""
    import linecache

    frame = sys._getframe(skip)
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename, user_files):
            line = linecache.getline(code.co_filename, frame.f_lineno).strip()
            return f"{os.path.basename(code.co_filename)}:{frame.f_lineno}", line
        frame = frame.f_back
    return None
