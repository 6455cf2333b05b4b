"""What one run of a captured model leaves behind: a record per node (or module call)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from inspector.report import TensorInfo
from inspector.tracebacks import is_user_file

__all__ = ["NodeRecord", "ModuleCall", "user_location_from_stack"]


@dataclass
class NodeRecord:
    name: str
    op: str
    target: str
    module_path: str | None  # innermost owning module, "" for the root
    calls: list[tuple[str, str]] = field(default_factory=list)  # (call key, path), outer first
    inputs: list[int] = field(default_factory=list)
    in_tensors: list[TensorInfo] = field(default_factory=list)
    out_tensors: list[TensorInfo] = field(default_factory=list)
    output_bytes: int = 0  # bytes of tensors this node is the first to produce
    params: int = 0
    flops: int = 0
    flops_backward: int | None = 0  # training-mode runs; None: no backward rule for an op
    location: str | None = None


@dataclass
class ModuleCall:
    """One call of a module: what went in, what came out."""

    path: str
    in_tensors: list[TensorInfo]
    out_tensors: list[TensorInfo]


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def user_location_from_stack(stack: str | None, user_files: Iterable[str]) -> str | None:
    """The "file.py:LINE" of the innermost frame of a recorded stack trace in a user file."""
    if not stack:
        return None
    roots = tuple(user_files)
    if not roots:
        return None
    found = None
    for path, line in _FRAME.findall(stack):
        if _is_user(path, roots):
            found = f"{os.path.basename(path)}:{line}"
    return found


@lru_cache(maxsize=4096)
def _is_user(path: str, roots: tuple[str, ...]) -> bool:
    return is_user_file(path, roots)  # cached: every node's stack repeats the same files
