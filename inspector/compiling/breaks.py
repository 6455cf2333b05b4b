"""Dynamo's graph-break reasons as report entries: torch's text split into its parts, the
user's line, and breaks at the same site with the same reason counted once."""

from __future__ import annotations

import linecache
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from inspector.health.locate import is_user_file
from inspector.report import GraphBreak

__all__ = ["graph_breaks"]

_URL = re.compile(r"(https?://\S+)")
_QUOTED = re.compile(r"`([^`]+)`")
# Reasons whose first line names the op plainly (older texts have no Explanation line).
_PLAIN_OP = re.compile(r"(Tensor\.\w+\(\)|torch\.\w+(?:\.\w+)*)")
_MAX_FRAMES = 6


def graph_breaks(reasons: Iterable[Any], user_files: Sequence[str]) -> list[GraphBreak]:
    """`reasons`: torch._dynamo's GraphCompileReason objects (explain's `break_reasons`)."""
    found: dict[tuple[str, str | None], GraphBreak] = {}
    for reason in reasons:
        item = _one(str(reason.reason), list(reason.user_stack or ()), user_files)
        key = (item.reason, item.where)
        if key in found:
            found[key].count += 1
        else:
            found[key] = item
    return list(found.values())


def _one(text: str, stack: list[Any], user_files: Sequence[str]) -> GraphBreak:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    # A logged break starts with where Dynamo was ("Encountered graph break when
    # attempting to trace CALL: ..."); torch's reason is the line after it.
    if len(lines) > 1 and lines[0].startswith("Encountered graph break"):
        lines = lines[1:]
    first = lines[0] if lines else text.strip()
    explanation = next((_after(line, "Explanation:") for line in lines if
                        line.startswith("Explanation:")), None)  # fmt: skip
    hints = [_after(line, "Hint:") for line in lines if line.startswith("Hint:")]
    url = next((m.group(1) for line in lines if (m := _URL.search(line))), None)
    frame = _user_frame(stack, user_files)
    mine = bool(user_files) and frame is not None and is_user_file(frame.filename, user_files)
    where = code = None
    if frame is not None:
        where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
        code = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip() or None
    return GraphBreak(
        reason=first,
        explanation=explanation,
        hints=hints,
        op=_op(first, explanation),
        where=where,
        code=code,
        frames=[_frame_text(f) for f in stack[-_MAX_FRAMES:]],
        url=url,
        in_user_code=mine,
    )


def _after(line: str, label: str) -> str:
    return line[len(label) :].strip()


def _user_frame(stack: list[Any], user_files: Sequence[str]) -> Any:
    """The innermost frame in the user's files, else the innermost frame at all (a break
    inside a library the model calls: its line still says where)."""
    for frame in reversed(stack):
        if is_user_file(frame.filename, user_files):
            return frame
    return stack[-1] if stack else None


def _op(first: str, explanation: str | None) -> str | None:
    """What Dynamo could not trace: torch quotes it in backticks in its explanation."""
    for text in (explanation or "", first):
        quoted = _QUOTED.search(text)
        if quoted:
            return quoted.group(1)
    plain = _PLAIN_OP.search(first)
    return plain.group(1) if plain else None


def _frame_text(frame: Any) -> str:
    return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"
