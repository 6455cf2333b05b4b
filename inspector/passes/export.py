"""Export readiness: does the model go through torch.export, TorchScript and ONNX?

Each target is tried on the user's inputs; the report keeps pass/fail, the first line of
the error and the user's line where the failure is in their code. `--export fast` (the
default) tries non-strict torch.export, what torch recommends; `--export all` adds strict
export, TorchScript and ONNX.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import re
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from inspector.context import Context
from inspector.graph.exportcapture import Flat, flat_tensors, lazy_recompiles, node_stacks
from inspector.health.exportmatch import (
    DynamicExport,
    EagerOutputs,
    changed_inputs,
    check_target,
)
from inspector.libraryoutput import library_output_captured, printed_summary
from inspector.memory.rough import step_bytes
from inspector.report import ExportTarget
from inspector.torchfakerules import rules_in_torch_modes
from inspector.tracebacks import user_location

__all__ = ["run", "compute", "apply", "needs", "TARGETS", "ONNX_MODULES"]

_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')

# A target: (context, the export with the named dims dynamic, which holds the inputs with
# each dim changed: `.others`) -> the exported artifact.
Attempt = Callable[[Context, DynamicExport], Any]


def _exported(ctx: Context, strict: bool, lean: bool) -> Any:
    """torch.export's program of the model on the sample. `lean`: made first without what
    only a failure's message reads, each node's line in the user's code (13% of CaiT's
    export), and with its code made once, where it runs, not after each of torch's passes
    (`lazy_recompiles`: 18%). Where that fails, for any reason, it is made again as it
    always was: its error, and the graph torch prints as it fails, naming each node's
    line, are the verdict. Strict export goes through Dynamo, whose graphs lose their
    input spec in torch's lazy modules: never lean."""
    args, kwargs = tuple(ctx.inputs.args), dict(ctx.inputs.kwargs)
    if lean:
        try:
            with library_output_captured(), node_stacks(False), lazy_recompiles():
                return torch.export.export(ctx.model, args, kwargs, strict=strict)
        except Exception:  # noqa: BLE001, S110 - said by the export below
            pass
    return torch.export.export(ctx.model, args, kwargs, strict=strict)


def _export_nonstrict(ctx: Context, dynamic: DynamicExport) -> Any:
    """The program with the named dims dynamic when it exports: it runs the sample as the
    static one would, and the changed dims too, so the static export is not made again.
    Else the static export, whose error is the verdict (the dynamic one's is said at the
    changed dims); where the dynamic one failed, the static one is made as it always was
    at once, as it most likely fails too."""
    if dynamic.others:
        with contextlib.suppress(Exception):
            dynamic.module()
            return dynamic
    return _exported(ctx, strict=False, lean=not dynamic.others and not _capture_failed(ctx))


def _export_strict(ctx: Context, dynamic: DynamicExport) -> Any:
    return _exported(ctx, strict=True, lean=False)


def _capture_failed(ctx: Context) -> bool:
    """The capture stage's own non-strict export of the model failed (the detectors'): this
    one most likely fails too, and is made as it always was at once."""
    attempts = ctx.capture.attempts if ctx.capture is not None else []
    return any(a.method == "export" and not a.ok for a in attempts)


def _script(ctx: Context) -> Any:
    return torch.jit.script(ctx.model)


def _trace(ctx: Context) -> Any:
    """One trace. torch's own check (`check_trace`) traces twice more on the same inputs
    and warns on a difference, which the filter below hides: the trace is checked here
    against eager on the sample and on each changed dim (health/exportmatch.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings are the user's to see, not ours
        if ctx.inputs.kwargs:
            return torch.jit.trace(
                ctx.model,
                example_kwarg_inputs=dict(ctx.inputs.kwargs),
                strict=False,
                check_trace=False,
            )
        return torch.jit.trace(ctx.model, tuple(ctx.inputs.args), strict=False, check_trace=False)


def _onnx(ctx: Context, dynamic: DynamicExport) -> Any:
    """The dynamo ONNX exporter on the flattened inputs, with the axes the named dims move
    left dynamic (Dim.AUTO, as for torch.export), so onnxruntime can run it at other dims."""
    args, kwargs = tuple(ctx.inputs.args), dict(ctx.inputs.kwargs)
    tensors = flat_tensors(args, kwargs)
    axes = dynamic.axes()
    auto = torch.export.Dim.AUTO
    shapes = {"tensors": tuple({a: auto for a in ax} for ax in axes)} if any(axes) else None
    # The exporter narrates its steps on stdout and logs warnings about optional packages;
    # the report is the place for its verdict.
    with contextlib.redirect_stdout(io.StringIO()), _quiet_logger("torch.onnx"):
        return torch.onnx.export(
            Flat(ctx.model, args, kwargs).eval(),
            tuple(tensors),
            dynamo=True,
            dynamic_shapes=shapes,
            verbose=False,
        )


# The targets `--export fast` leaves out. Strict export (Dynamo) and the ONNX exporter
# take seconds even on small models. TorchScript is deprecated (torch 2.13 warns at
# torch.jit.script and torch.jit.trace: "switch to torch.compile or torch.export"), and
# its two targets cost four forwards of checks: a third of ResNet-18's report.
SLOW_TARGETS = {"export-strict", "torchscript-script", "torchscript-trace", "onnx"}


@contextlib.contextmanager
def _quiet_logger(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


TARGETS: list[tuple[str, Attempt]] = [
    ("export-nonstrict", _export_nonstrict),
    ("export-strict", _export_strict),
    ("torchscript-script", lambda ctx, dynamic: _script(ctx)),
    ("torchscript-trace", lambda ctx, dynamic: _trace(ctx)),
    ("onnx", _onnx),
]
# What running an ONNX target needs: the exporter (onnx, onnxscript) and a runtime.
ONNX_MODULES = ("onnx", "onnxscript", "onnxruntime")


def run(ctx: Context) -> None:
    """Fill `report.export` with one entry per target `ctx.options.export` asks for."""
    apply(ctx, compute(ctx))


def compute(ctx: Context) -> list[ExportTarget]:
    """The targets, tried and checked against eager; the report untouched (so it can run
    beside the passes after memory: inspector/beside.py). Eager's run on the sample is
    the modes pass's where that ran before, else its own: the same seeded forward."""
    level = ctx.options.export
    chosen = [
        (name, attempt)
        for name, attempt in TARGETS
        if level == "all" or (level == "fast" and name not in SLOW_TARGETS)
    ]
    others = changed_inputs(ctx) if chosen and not ctx.options.fake else []
    dynamic = DynamicExport(ctx, others)  # made once, when a target asks for it
    artifacts: dict[str, Any] = {}
    with rules_in_torch_modes():  # the exports' fake runs (inspector/torchfakerules.py)
        targets = [_try(ctx, name, attempt, dynamic, artifacts) for name, attempt in chosen]
    eager = EagerOutputs(ctx)  # one eager run per input set, whatever the targets
    for target in targets:
        if target.target in artifacts:
            check_target(ctx, target, artifacts[target.target], others, eager, dynamic)
    return targets


def apply(ctx: Context, targets: list[ExportTarget]) -> None:
    ctx.report.export.targets = targets


def needs(ctx: Context) -> int | None:
    """Bytes the pass takes at most: eager's outputs kept while the exported program
    runs on the same inputs, each about an inference forward's peak; None (in its place)
    without an estimate or bounds. Where real runs are the cheap ones its tracing is
    Python, and goes beside the memory pass's (started after that pass, it had only
    slowed the others down: a 1,000-layer stack, 11.1 s to 12.7 s)."""
    known = step_bytes(ctx)
    return None if known is None else 3 * known.forward_peak


def _try(
    ctx: Context,
    name: str,
    attempt: Attempt,
    dynamic: DynamicExport,
    artifacts: dict[str, Any],
) -> ExportTarget:
    skip = _skip_reason(ctx, name)
    if skip:
        return ExportTarget(target=name, ok=None, error=skip)
    reused = _from_capture(ctx, name)
    if reused is not None:
        return reused
    start = time.perf_counter()
    modes = {m: m.training for m in ctx.model.modules()}
    ctx.model.eval()  # exports are for inference: BatchNorm and Dropout in eval mode
    try:
        with library_output_captured() as out:  # a failing export dumps its graph
            artifacts[name] = attempt(ctx, dynamic)
    except Exception as exc:  # any failure is the answer we report
        output = printed_summary(out.text)
        return ExportTarget(
            target=name,
            ok=False,
            error=_first_line(exc) + (f"\n({output})" if output else ""),
            location=_location(exc, ctx.loaded.user_files),
            seconds=round(time.perf_counter() - start, 3),
        )
    finally:
        for module, mode in modes.items():
            module.training = mode
    return ExportTarget(target=name, ok=True, seconds=round(time.perf_counter() - start, 3))


def _skip_reason(ctx: Context, name: str) -> str | None:
    if ctx.options.fake:
        return "not attempted: fake mode has no weights to export (run without --fake)"
    missing = [m for m in ONNX_MODULES if importlib.util.find_spec(m) is None]
    if name == "onnx" and missing:
        return (
            f"not attempted: {', '.join(missing)} not installed (pip install "
            "'model-graph-inspector[export]' installs onnx, onnxscript and onnxruntime)"
        )
    if ctx.loaded.source_kind == "torchscript" and name.startswith("torchscript"):
        return "the model already is TorchScript"
    return None


def _from_capture(ctx: Context, name: str) -> ExportTarget | None:
    """The capture stage already ran torch.export non-strict when fx failed: reuse it."""
    if name != "export-nonstrict" or ctx.capture is None or ctx.capture.method != "export":
        return None
    if ctx.model.training:
        return None  # captured in train mode; readiness is judged in eval mode
    attempt = next((a for a in ctx.capture.attempts if a.method == "export"), None)
    if attempt is None or not attempt.ok:
        return None
    return ExportTarget(target=name, ok=True, seconds=attempt.seconds)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(exc: BaseException) -> str:
    """The exception's first line, and its root cause's when it wraps one (ONNX does)."""
    parts = []
    seen = 0
    while exc is not None and seen < 4:
        text = _ANSI.sub("", str(exc)).strip() or type(exc).__name__
        first = next((line for line in text.splitlines() if line.strip()), text)
        parts.append(f"{type(exc).__name__}: {first[:300]}")
        exc, seen = exc.__cause__, seen + 1
    return parts[0] if len(parts) == 1 else f"{parts[0]} (caused by {parts[-1]})"


def _location(exc: BaseException, user_files: list[str]) -> str | None:
    found = user_location(exc, user_files)
    if found:
        return found[0]
    # Dynamo and TorchScript name the user's line in the message, not in the traceback.
    import os

    users = [os.path.realpath(f) for f in user_files]
    for path, line in _FILE_LINE.findall(str(exc)):
        real = os.path.realpath(path)
        if any(real == u or real.startswith(u.rstrip(os.sep) + os.sep) for u in users):
            return f"{os.path.basename(path)}:{line}"
    return None
