"""Differences between two reports: summary figures and per-module changes.

Pure data in, pure data out (no torch): the API, the compare page, the Markdown summary
and the CLI all show the same numbers.
"""

from __future__ import annotations

from typing import Any

from inspector.report import Module, Report
from inspector.schema.figures import FIGURES

__all__ = ["compare_reports", "delta", "setup_drift", "distributed_diff", "DRIFT_KEYS"]


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
        "drift": setup_drift(a, b),
        "distributed": distributed_diff(a, b),
    }


def distributed_diff(a: Report, b: Report) -> dict[str, Any]:
    """Per `--parallel` plan (by its normal form) the heaviest rank's peak; per strategy
    and budget the fewest GPUs; the fit plans' verified peak and GPUs. A plan or count
    only one side has shows with the other side None."""
    plans_a = {p.spec: p.per_rank_peak_bytes for p in a.distributed.plans}
    plans_b = {p.spec: p.per_rank_peak_bytes for p in b.distributed.plans}
    gpus_a = {(g.strategy, g.budget_bytes): g.gpus for g in a.distributed.gpus_needed}
    gpus_b = {(g.strategy, g.budget_bytes): g.gpus for g in b.distributed.gpus_needed}
    fit_a, fit_b = a.memory.fit_plan, b.memory.fit_plan
    return {
        "plans": [
            {"spec": s, "per_rank_peak_bytes": delta(plans_a.get(s), plans_b.get(s))}
            for s in dict.fromkeys([*plans_a, *plans_b])
        ],
        "gpus_needed": [
            {"strategy": k[0], "budget_bytes": k[1], "gpus": delta(gpus_a.get(k), gpus_b.get(k))}
            for k in dict.fromkeys([*gpus_a, *gpus_b])
        ],
        "fit_plan": None if fit_a is None and fit_b is None else {
            "verified_peak_bytes": delta(fit_a and fit_a.verified_peak_bytes,
                                         fit_b and fit_b.verified_peak_bytes),
            "gpus": delta(fit_a and fit_a.gpus, fit_b and fit_b.gpus),
        },
    }  # fmt: skip


# What a report was computed with that changes its figures, key -> label. A difference
# in one of these between two reports is drift: the figures' changes may come from it.
DRIFT_KEYS: dict[str, str] = {
    "torch": "torch",
    "python": "Python",
    "cuda": "CUDA",
    "cudnn": "cuDNN",
    "transformers": "transformers",
    "gpu_name": "GPU",
    "device": "device",
    "dtype": "activation dtype",
    "optimizer": "optimizer",
    "batch": "batch",
    "fake": "fake tensors",
}


def setup_drift(a: Report, b: Report) -> list[dict[str, Any]]:
    """`[{"key", "label", "a", "b"}]` for each version or option that differs. A side
    that does not know a value (a report older than `meta.versions`) is no drift."""
    old, new = _setup(a), _setup(b)
    return [
        {"key": key, "label": label, "a": old[key], "b": new[key]}
        for key, label in DRIFT_KEYS.items()
        if old.get(key) is not None and new.get(key) is not None and old[key] != new[key]
    ]


def _setup(report: Report) -> dict[str, Any]:
    meta = report.meta
    found: dict[str, Any] = {k: v for k, v in meta.versions.items() if v is not None}
    found.setdefault("torch", meta.torch_version or None)
    found.setdefault("python", meta.python_version or None)
    found["device"] = meta.device or None
    found["dtype"] = meta.options.get("dtype")
    found["optimizer"] = meta.options.get("optimizer") or report.memory.optimizer
    batch_dim = report.memory.batch_dim or ("B" if "B" in meta.dims else None)
    found["batch"] = meta.dims.get(batch_dim) if batch_dim else None
    found["fake"] = meta.fake
    return found


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
