"""Text forms of report values that the templates and the view models share."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

__all__ = ["shape", "pct", "when"]


def shape(shapes: Any) -> str:
    """[["B", 3, 224]] -> 'B×3×224'; several tensors joined by commas."""
    if not shapes:
        return ""
    if not isinstance(shapes[0], list):
        shapes = [shapes]
    return ", ".join("×".join(str(d) for d in s) if s else "scalar" for s in shapes)


def pct(value: float | None) -> str:
    """0.5 -> '+0.5%'; '-' where there is no number (a delta from zero)."""
    if value is None or math.isinf(value) or math.isnan(value):
        return "-"
    return f"{value:+.1f}%"


def when(moment: dt.datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "-"
