"""Rules on export readiness (the `export` section): each target that failed."""

from __future__ import annotations

from collections.abc import Iterator

from inspector.context import Context
from inspector.report import Finding, Report
from inspector.rules.registry import finding, rule

_FIX = {
    "export-nonstrict": "Make the failing line traceable: data-dependent branches become "
    "torch.cond, data-dependent sizes need torch._check hints.",
    "export-strict": "Strict export compiles forward with Dynamo: replace unsupported Python "
    "(data-dependent branches, calls into non-torch libraries) or export with strict=False.",
    "torchscript-script": "TorchScript supports a subset of Python: annotate types, avoid "
    "try/except, lambdas and **kwargs, or use torch.export instead (TorchScript is deprecated).",
    "torchscript-trace": "Tracing runs forward once: inputs of other shapes or values may "
    "take other branches; prefer torch.export.",
    "onnx": "The dynamo ONNX exporter starts from torch.export: fix the torch.export error first.",
}


@rule("export-failed", "info")
def export_failed(ctx: Context, report: Report) -> Iterator[Finding]:
    """A deployment target (torch.export, TorchScript, ONNX) rejected the model. Info: the
    model still trains; it matters when it has to be deployed that way."""
    for target in report.export.targets:
        if target.ok is not False:
            continue
        at = f" at {target.location}" if target.location else ""
        yield finding(
            "export-failed",
            target.location or "",
            f"{target.target} fails{at}: {target.error}",
            _FIX.get(target.target, ""),
        )


@rule("export-mismatch", "warning")
def export_mismatch(ctx: Context, report: Report) -> Iterator[Finding]:
    """A target that exported computes something else than eager: on the sample, or once
    a named dim changes (a trace that baked in a branch or a batch size)."""
    for target in report.export.targets:
        if not target.ok or not target.mismatch:
            continue
        checked = ", ".join(target.checked)
        yield finding(
            "export-mismatch",
            target.target,
            f"{target.target} exported, but does not match eager at {target.mismatch} "
            f"(checked: {checked}).",
            _MISMATCH_FIX.get(target.target.split("-")[0], _MISMATCH_FIX["export"]),
        )


_MISMATCH_FIX = {
    "export": "A dim torch.export specialised: mark it dynamic "
    "(dynamic_shapes={'x': {0: Dim('B')}}) and remove what pins it (a Python int from "
    "x.shape used as a constant, a branch on a size); torch._check hints for sizes.",
    "torchscript": "Tracing records one path: sizes read as Python ints and branches on "
    "values are baked in. Use torch.jit.script or torch.export instead of trace.",
    "onnx": "The ONNX program starts from torch.export: fix dynamic dims there "
    "(dynamic_shapes), then export again.",
}
