"""What a zoo row says about one report: its figures beside the truth's, and the alarms.

Shared by tests/test_zoo.py and bench/zoo.py so the test and the table agree.
"""

from __future__ import annotations

import tempfile
from typing import Any

from zoo_models import entry_file

__all__ = ["inspect_zoo", "summarize", "blank_modules", "alarms", "red_verdicts", "FLOPS_RTOL"]

# FLOPs agree with FlopCounterMode (CPU SDPA added, see zoo_truth) within this share.
FLOPS_RTOL = 0.01
SAVED_RTOL = 0.01  # issue #16: saved activations within 1% of the measured step
PEAK_RTOL = 0.02  # and the training-step peak within 2%
# Gradient verdicts that are problems (inspector.schema.findings.PROBLEM_VERDICTS).
_RED = {"nan", "cut", "unused", "vanishing", "exploding"}


def inspect_zoo(name: str, fake: bool, **options: Any) -> Any:
    """The report of zoo model `name` through the real loader (`file.py:model`)."""
    from inspector.analyze import inspect_model
    from inspector.context import Options

    with tempfile.TemporaryDirectory() as tmp:
        source = entry_file(name, tmp)
        return inspect_model(source, None, Options(fake=fake, **options))


def blank_modules(report: Any, ran: list[str]) -> list[str]:
    """Modules whose forward ran (and returned a tensor) but have no output shape. A
    torch.compile'd submodule is reported as its original module (`mid`, not
    `mid._orig_mod`): the truth's paths are read the same way."""
    shaped = {m.path for m in report.modules if m.output_shapes}
    return [p for p in ran if _uncompiled(p) not in shaped]


def _uncompiled(path: str) -> str:
    return ".".join(part for part in path.split(".") if part != "_orig_mod")


def alarms(report: Any) -> list[str]:
    """`rule@where` of every warning and error finding."""
    return [f"{f.rule}@{f.where}" for f in report.findings if f.severity in ("warning", "error")]


def red_verdicts(report: Any) -> list[str]:
    """`verdict@layer` of every layer the gradients table shows as a problem."""
    return [f"{x.verdict}@{x.module_path}" for x in report.gradients.layers if x.verdict in _RED]


def _ratio(value: float | None, truth: float | None) -> float | None:
    if value is None or not truth:
        return None
    return value / truth


def _error(value: float | None, truth: float | None) -> float | None:
    ratio = _ratio(value, truth)
    return None if ratio is None else ratio - 1


def summarize(report: Any, truth: Any) -> dict[str, Any]:
    """The row's figures for one report against `truth` (a zoo_truth.Truth)."""
    memory = report.memory
    measured = memory.measured
    failed = [a for a in report.capture.attempts if not a.ok]
    return {
        "capture": report.capture.method,
        "capture_failed": [f"{a.method}: {(a.error or '')[:120]}" for a in failed],
        "params": report.totals.params,
        "params_exact": report.totals.params == truth.params,
        "flops": report.totals.flops_forward,
        "flops_ratio": _ratio(report.totals.flops_forward, truth.flops),
        "saved": memory.saved_activation_bytes,
        "saved_err": _error(memory.saved_activation_bytes, truth.saved_bytes),
        "peak": memory.train_peak_bytes,
        "peak_err": _error(memory.train_peak_bytes, truth.train_peak_bytes),
        "self_peak_err": measured.train_peak_error if measured else None,
        "blank": blank_modules(report, truth.ran),
        "alarms": alarms(report),
        "red": red_verdicts(report),
        "warnings": [w[:200] for w in report.meta.warnings],
        "seconds": round(sum(report.meta.timings_s.values()), 1),
    }
