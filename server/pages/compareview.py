"""The view model of two reports compared: `inspector.compare.compare_reports` arranged
for compare.html (labels, units, rows)."""

from __future__ import annotations

from typing import Any

from inspector.compare import compare_reports
from inspector.report import Report
from inspector.schema.figures import FIGURES
from inspector.units import format_bytes, format_count
from server.pages.formats import pct, shape

__all__ = ["COMPARE_FIGURES", "compare_view"]

# The figures of inspector.schema.figures the page compares, in display order.
COMPARE_FIGURES = (
    "params",
    "trainable_params",
    "flops_forward",
    "flops_backward",
    "forward_peak_bytes",
    "train_peak_bytes",
    "saved_activation_bytes",
    "param_bytes",
    "grad_bytes",
    "optimizer_bytes",
    "node_count",
    "graph_break_count",
    "findings_errors",
    "findings_warnings",
)


def _fmt(value: float | None, unit: str) -> str:
    """Bytes in binary units; counts and FLOPs as plain counts (short past 10,000)."""
    if value is None:
        return "-"
    if unit == "bytes":
        return format_bytes(value)
    return format_count(value) if abs(value) >= 10_000 else f"{value:,}"


def _signed(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return ("+" if value > 0 else "") + _fmt(value, unit) if value else "0"


def compare_view(a: Report, b: Report) -> dict[str, Any]:
    """Summary rows, max-batch deltas, module rows, findings and gradient series."""
    diff = compare_reports(a, b)
    return {
        "summary": _summary_rows(diff["summary"]),
        "max_batch": _max_batch_deltas(diff.get("max_batch", {})),
        "modules": _module_rows(diff["modules"]),
        "unchanged": diff["modules"].get("unchanged", 0),
        "findings": diff.get("findings", {"added": [], "resolved": []}),
        "drift": diff.get("drift", []),
        "distributed": _distributed_rows(diff.get("distributed", {})),
        "grads": {"a": _grad_series(a), "b": _grad_series(b)},
    }


def _summary_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key in COMPARE_FIGURES:
        d = summary.get(key)
        if d is None:
            continue
        label, unit = FIGURES[key].label, FIGURES[key].unit
        rows.append({
            "key": key, "label": label, "a": _fmt(d["a"], unit), "b": _fmt(d["b"], unit),
            "delta": _signed(d["delta"], unit), "percent": pct(d["percent"]),
            "direction": d["direction"],
        })  # fmt: skip
    return rows


def _row(key: str, label: str, d: dict[str, Any], unit: str) -> dict[str, Any]:
    return {
        "key": key, "label": label, "a": _fmt(d["a"], unit), "b": _fmt(d["b"], unit),
        "delta": _signed(d["delta"], unit), "percent": pct(d["percent"]),
        "direction": d["direction"],
    }  # fmt: skip


def _distributed_rows(diff: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-plan heaviest-rank peaks, GPUs needed per strategy and budget, the fit plan."""
    rows = [
        _row(f"per_rank_peak_{p['spec']}", f"Heaviest rank, {p['spec']}",
             p["per_rank_peak_bytes"], "bytes")
        for p in diff.get("plans", [])
    ]  # fmt: skip
    rows += [
        _row(f"gpus_{g['strategy']}_{g['budget_bytes']}",
             f"GPUs needed, {g['strategy']} on {format_bytes(g['budget_bytes'])}", g["gpus"],
             "count")
        for g in diff.get("gpus_needed", [])
    ]  # fmt: skip
    fit = diff.get("fit_plan")
    if fit:
        rows.append(_row("fit_verified_peak", "Fit plan, verified peak",
                         fit["verified_peak_bytes"], "bytes"))  # fmt: skip
        rows.append(_row("fit_gpus", "Fit plan, GPUs", fit["gpus"], "count"))
    return rows


def _max_batch_deltas(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"budget": format_bytes(int(k)), **d} for k, d in rows.items() if k.isdigit()]


def _module_rows(modules: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [_one_sided_row("added", m) for m in modules["added"]]
    rows += [_one_sided_row("removed", m) for m in modules["removed"]]
    rows += [_changed_row(c) for c in modules["changed"]]
    return sorted(rows, key=lambda r: r["path"])


def _one_sided_row(status: str, module: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": status, "path": module["path"], "type": module["type"],
        "shapes": shape(module["output_shapes"]), "params": format_count(module["params"]),
    }  # fmt: skip


def _changed_row(change: dict[str, Any]) -> dict[str, Any]:
    c = change["changes"]
    row = {"status": "changed", "path": change["path"], "type": change["type"]}
    if "type" in c:
        row["type"] = f"{c['type']['a']} → {c['type']['b']}"
    if "output_shapes" in c:
        row["shapes"] = f"{shape(c['output_shapes']['a'])} → {shape(c['output_shapes']['b'])}"
    if "params" in c:
        row["params"] = _signed(c["params"]["delta"], "count")
    if "output_bytes" in c:
        row["memory"] = _signed(c["output_bytes"]["delta"], "bytes")
    if "flops_forward" in c:
        row["flops"] = _signed(c["flops_forward"]["delta"], "count")
    return row


def _grad_series(report: Report) -> list[dict[str, Any]]:
    layers = sorted(report.gradients.layers, key=lambda g: g.depth_index)
    return [{"path": g.module_path, "grad_norm": g.grad_norm} for g in layers]
