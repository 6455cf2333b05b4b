"""Capture: get a graph of the model. fx first, then torch.export, then module hooks.

The fx attempt is plain `symbolic_trace` (submodules it cannot trace kept whole), and where
that fails at the root, fx guided by meta values (see graph/guidedfx.py: Hugging Face
models, branches on traced sizes); export comes next when that fails too.

Every attempt is recorded (method, ok, error, the user's file:line and its text, time):
why tracing failed is itself useful to the user. Works on real and on fake tensors: under
`ctx.fake_mode` export traces the fake model, and hooks run it with fake inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from inspector.context import CaptureResult, Context
from inspector.graph.allocated import AllocatedBytes
from inspector.graph.exportcapture import WRAPPED, export_graph, flat_tensors, moving_axes
from inspector.graph.fxcapture import FxCapture, trace_fx
from inspector.graph.fxerrors import FxTraceError, error_type, explain_guided
from inspector.graph.guidedfx import GuidedCapture, trace_guided
from inspector.graph.hooks import record_hooks
from inspector.graph.lenient import fake_context
from inspector.graph.modelstate import attributes_kept
from inspector.graph.runner import perturb_fake_mode, preserved_state
from inspector.graph.symdims import perturbed_value
from inspector.libraryoutput import printed, printed_summary
from inspector.report import CaptureAttempt
from inspector.tracebacks import runs_user_code, user_location

__all__ = ["capture_graph"]

_MAX_ERROR = 2000  # characters of an error message kept in the report


def capture_graph(ctx: Context) -> CaptureResult:
    """Try fx, export, hooks in turn; the first that works is the capture."""
    attempts: list[CaptureAttempt] = []
    methods: list[tuple[str, Callable[[Context], tuple[CaptureResult, str | None]]]] = [
        ("fx", _fx),
        ("export", _export),
        ("hooks", _hooks),
    ]
    if ctx.loaded.exported is not None:  # a .pt2 upload is an export graph already
        methods = [("export", _loaded_export), ("hooks", _hooks)]
    result = _first_that_works(ctx, methods, attempts)
    if result is None and ctx.model.training:
        result = _in_eval_mode(ctx, methods, attempts)
    return result or CaptureResult(method=None, attempts=attempts)


def _first_that_works(
    ctx: Context, methods: list, attempts: list[CaptureAttempt], eval_mode: bool = False
) -> CaptureResult | None:
    for method, attempt in methods:
        start = time.perf_counter()
        try:
            with attributes_kept(ctx.model):  # a trace may store traced values on modules
                result, note = attempt(ctx)
        except Exception as exc:  # the user's model failed this method: record, go on
            attempts.append(_failed(method, exc, ctx, time.perf_counter() - start))
            attempts[-1].eval_mode = eval_mode
            continue
        attempts.append(_ok(method, note, time.perf_counter() - start))
        attempts[-1].eval_mode = eval_mode
        result.attempts, result.eval_mode = attempts, eval_mode
        return result
    return None


def _in_eval_mode(
    ctx: Context, methods: list, attempts: list[CaptureAttempt]
) -> CaptureResult | None:
    """A model whose train mode fails (a detector that needs targets the inputs lack) is
    captured in eval mode: its nodes, shapes and FLOPs are those of the eval forward. A
    hooks run in eval mode comes first, as the probe: when it fails too, eval mode is no
    way out and nothing more is tried (or recorded)."""
    training = {m: m.training for m in ctx.model.modules()}
    ctx.model.eval()
    try:
        start = time.perf_counter()
        try:
            probe, _ = _hooks(ctx)
        except Exception:
            return None
        seconds = time.perf_counter() - start
        others = [(name, attempt) for name, attempt in methods if name != "hooks"]
        result = _first_that_works(ctx, others, attempts, eval_mode=True)
    finally:
        for module, mode in training.items():
            module.training = mode
    if result is None:  # the probe's run is the capture
        attempts.append(_ok("hooks", None, seconds))
        attempts[-1].eval_mode = True
        result = probe
        result.attempts, result.eval_mode = attempts, True
    why = attempts[0]
    ctx.report.meta.warnings.append(
        f"the model fails in train mode ({why.error_type}: {_first_line(why.error)}): "
        f"captured in eval mode with {result.method}; nodes, shapes and FLOPs are those "
        "of the eval forward."
    )
    return result


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:300] if (text or "").strip() else ""


def _ok(method: str, note: Any, seconds: float) -> CaptureAttempt:
    attempt = CaptureAttempt(method=method, ok=True, seconds=round(seconds, 4))
    if note is not None:  # fx kept some submodules whole: say why
        text, exc, where = note
        attempt.error = text
        attempt.error_type = error_type(exc)
        attempt.location, attempt.source_line = where or (None, None)
    return attempt


def _failed(method: str, exc: BaseException, ctx: Context, seconds: float) -> CaptureAttempt:
    where = user_location(exc, ctx.loaded.user_files)
    return CaptureAttempt(
        method=method,
        ok=False,
        error=_message(exc),
        error_type=error_type(exc),
        location=where[0] if where else None,
        source_line=where[1] if where else None,
        seconds=round(seconds, 4),
    )


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    text = text if len(text) <= _MAX_ERROR else text[:_MAX_ERROR] + " ..."
    output = printed_summary(printed(exc))  # what torch.export dumped on stderr meanwhile
    return f"{text}\n({output})" if output else text


def _fx(ctx: Context) -> tuple[CaptureResult, Any]:
    result = CaptureResult(method="fx", attempts=[])
    plain: Exception | None = None
    try:
        cap: FxCapture | GuidedCapture = trace_fx(ctx.model, ctx.inputs.args, ctx.inputs.kwargs)
    except Exception as exc:
        plain = exc
    if plain is not None:
        cap = _guided(ctx, plain, result)
    result.graph_module, result.fx_leaves = cap.graph_module, cap.leaves
    files = ctx.loaded.user_files
    if plain is not None:  # the guided trace got round plain fx's failure
        result.decisions = cap.decisions
        taken = sum(d.why != "rank" for d in cap.decisions)
        text = (
            f"torch.fx.symbolic_trace failed ({error_type(plain)}: {_message(plain)}); "
            f"traced again with meta values taking the model's {taken} Python "
            f"decision{'s' if taken != 1 else ''} on traced values as the example inputs "
            "take them (each is checked again with every named dim changed)"
        )
        return result, (text, plain, user_location(plain, files))
    if not cap.leaves or cap.first_error is None:
        return result, None
    names = ", ".join(repr(p) for p in cap.leaves)
    text = (
        f"traced with {names} kept whole (one node each): fx cannot trace through it: "
        f"{type(cap.first_error).__name__}: {_message(cap.first_error)}"
    )
    return result, (text, cap.first_error, user_location(cap.first_error, files))


def _guided(ctx: Context, plain: Exception, result: CaptureResult) -> GuidedCapture:
    """fx guided by meta values (see guidedfx); when that fails too, raises one error
    that says why each trace stopped (plain fx's first: its type and the user's line)."""
    cap, guided = None, None
    try:
        inputs = ctx.inputs
        result.stack_traces = _stacks(ctx)
        cap = trace_guided(ctx.model, inputs.args, inputs.kwargs, stack_traces=result.stack_traces)
    except Exception as exc:
        guided = explain_guided(exc)
    if cap is None:  # raised outside a handler: the guided error is not its context
        raise FxTraceError(
            f"{_message(plain)}; traced again with meta values deciding the Python "
            f"branches, fx stopped: {guided}",
            error_type(plain),
        ) from plain
    return cap


def _export(ctx: Context) -> tuple[CaptureResult, Any]:
    # our export wraps the model (see exportcapture.Flat): module paths carry its prefix
    result = CaptureResult(method="export", attempts=[], strip=WRAPPED, stack_traces=_stacks(ctx))
    args, kwargs = ctx.inputs.args, ctx.inputs.kwargs
    dynamic = _dynamic_axes(ctx, result)
    if dynamic:  # one symbolic export replaces a re-export per named dim
        try:
            result.exported, result.graph_module = _dynamic_export(ctx, result, dynamic)
            result.export_dynamic = True
            result.reexport = False  # perturbed runs re-run this graph
            return result, None
        except Exception:  # a static export may still work
            pass
    result.exported, result.graph_module = export_graph(
        ctx.model, args, kwargs, ctx.fake_mode, stack_traces=result.stack_traces
    )
    result.export_dynamic = False
    result.reexport = True  # its shapes are baked in
    return result, None


def _dynamic_export(
    ctx: Context, result: CaptureResult, dynamic: list[list[int]]
) -> tuple[Any, Any]:
    """Export with the named dims symbolic. Export fixes any dim of size 1, so a named dim
    of 1 (B=1) is exported at 2 and the graph, free of guards, runs at 1; the graph pass
    falls back to a static export should that run fail."""
    dims = dict(ctx.inputs.dims)
    probe = {d: 2 if v == 1 else v for d, v in dims.items()}
    if probe == dims:
        return export_graph(
            ctx.model, ctx.inputs.args, ctx.inputs.kwargs, ctx.fake_mode, dynamic,
            stack_traces=result.stack_traces,
        )  # fmt: skip
    with ctx.fake_mode or nullcontext():
        inputs = ctx.factory.build(dims=probe, device=ctx.options.device)
    result.export_probe = True  # set before exporting: stays set if the static one is used
    return export_graph(
        ctx.model, inputs.args, inputs.kwargs, ctx.fake_mode, dynamic, guards=False,
        stack_traces=result.stack_traces,
    )  # fmt: skip


def _stacks(ctx: Context) -> bool:
    """Record node stacks only where they can name a user line (see runs_user_code)."""
    return runs_user_code(ctx.model, ctx.loaded.user_files)


def _dynamic_axes(ctx: Context, result: CaptureResult) -> list[list[int]] | None:
    """Axes of the input tensors that move with a named dim (inputs rebuilt, fake, with
    each dim changed: no model run)."""
    dims = dict(ctx.inputs.dims)
    if not dims:
        return None
    mode, others, names = perturb_fake_mode(ctx), [], []
    for d, v in dims.items():
        changed = {**dims, d: perturbed_value(v)}
        try:
            with mode:
                inputs = ctx.factory.build(dims=changed, device=ctx.options.device)
        except Exception:  # that dim stays static
            continue
        others.append(flat_tensors(inputs.args, inputs.kwargs))
        names.append(d)
    base = flat_tensors(ctx.inputs.args, ctx.inputs.kwargs)
    # which named dim moves each axis: the graph pass reads the symbols back by these
    result.axis_dims = _axis_dims(base, others, names)
    axes = moving_axes(base, others)
    return axes if any(axes) else None


def _axis_dims(base: list, others: list[list], names: list[str]) -> list[dict[int, str]]:
    """For each input tensor, {axis: the one named dim that moves it}."""
    out = []
    for i, t in enumerate(base):
        moved: dict[int, str | None] = {}
        for name, other in zip(names, others, strict=True):
            for axis in moving_axes([t], [other[i : i + 1]])[0]:
                moved[axis] = None if axis in moved else name  # two dims: neither
        out.append({a: n for a, n in moved.items() if n})
    return out


def _loaded_export(ctx: Context) -> tuple[CaptureResult, Any]:
    ep = ctx.loaded.exported
    # no wrapper: module paths are the model's own (strip=None)
    return CaptureResult(method="export", attempts=[], graph_module=ep.module(), exported=ep), None


def _hooks(ctx: Context) -> tuple[CaptureResult, Any]:
    model = ctx.model
    with (
        preserved_state(model, real=ctx.fake_mode is None),
        fake_context(ctx.fake_mode),
        AllocatedBytes() as allocated,
    ):
        records = record_hooks(
            model, lambda: ctx.inputs.call(model), user_files=ctx.loaded.user_files
        )
    # the graph pass reuses this run; what it allocated bounds a step's memory early
    return CaptureResult(
        method="hooks", attempts=[], records=records, allocated_bytes=allocated.total
    ), None
