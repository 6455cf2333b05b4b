"""Differences between two reports: summary figures and per-module changes.

Pure data in, pure data out (no torch): the API, the compare page, the Markdown summary
and the CLI all show the same numbers.
"""

from __future__ import annotations

from typing import Any

from inspector.report import Module, Report
from inspector.schema.figures import FIGURES

__all__ = ["compare_reports", "delta"]


def delta(a: int | float | None, b: int | float | None) -> dict[str, Any]:
    """`{"a", "b", "delta", "percent", "direction"}`; percent is relative to `a`, None
    when `a` is 0 or a side is missing; direction is up / down / same (None if missing)."""
    if a is None or b is None:
        return {"a": a, "b": b, "delta": None, "percent": None, "direction": None}
    change = b - a
    percent = round(100.0 * change / a, 2) if a else None
    direction = "up" if change > 0 else "down" if change < 0 else "same"
    return {"a": a, "b": b, "delta": change, "percent": percent, "direction": direction}


def compare_reports(a: Report, b: Report) -> dict[str, Any]:
    """What changed from `a` (the baseline) to `b`."""
    return {
        "summary": {key: delta(f.read(a), f.read(b)) for key, f in FIGURES.items()},
        "max_batch": _max_batch(a, b),
        "modules": _modules(a, b),
        "findings": _findings_diff(a, b),
    }


def _max_batch(a: Report, b: Report) -> dict[str, dict[str, Any]]:
    budgets = sorted(set(a.memory.max_batch) | set(b.memory.max_batch), key=_as_int)
    return {k: delta(a.memory.max_batch.get(k), b.memory.max_batch.get(k)) for k in budgets}


def _as_int(text: str) -> int:
    return int(text) if text.isdigit() else 0


def _module_row(m: Module) -> dict[str, Any]:
    return {"path": m.path, "type": m.type, "output_shapes": m.output_shapes, "params": m.params}


def _modules(a: Report, b: Report) -> dict[str, Any]:
    old = {m.path: m for m in a.modules}
    new = {m.path: m for m in b.modules}
    changed = [c for p in old if p in new and (c := _module_change(old[p], new[p]))]
    return {
        "added": [_module_row(m) for p, m in new.items() if p not in old],
        "removed": [_module_row(m) for p, m in old.items() if p not in new],
        "changed": changed,
        "unchanged": sum(1 for p in old if p in new) - len(changed),
    }


def _module_change(a: Module, b: Module) -> dict[str, Any] | None:
    changes: dict[str, Any] = {}
    for field in ("type", "input_shapes", "output_shapes", "output_dtypes"):
        if getattr(a, field) != getattr(b, field):
            changes[field] = {"a": getattr(a, field), "b": getattr(b, field)}
    for field in ("params", "flops_forward", "output_bytes"):
        if getattr(a, field) != getattr(b, field):
            changes[field] = delta(getattr(a, field), getattr(b, field))
    return {"path": a.path, "type": b.type, "changes": changes} if changes else None


def _findings_diff(a: Report, b: Report) -> dict[str, list[dict[str, Any]]]:
    def key(f: Any) -> tuple[str, str]:
        return (f.rule, f.where)

    old = {key(f) for f in a.findings}
    new = {key(f) for f in b.findings}
    return {
        "added": [f.model_dump() for f in b.findings if key(f) not in old],
        "resolved": [f.model_dump() for f in a.findings if key(f) not in new],
    }
