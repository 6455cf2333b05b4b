"""One forward + backward of the real model: parameter gradients, where the autograd
path is cut, and a readable diagnosis when an in-place op breaks the backward."""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from inspector.context import Context
from inspector.health.locate import is_user_file
from inspector.health.outputs import LossOutput, float_outputs, loss_outputs, make_loss
from inspector.health.recorder import CutPoint, ForwardRecorder, InplaceOp, recording
from inspector.health.scalefree import feeding_normalisation
from inspector.health.state import seeded
from inspector.health.stats import float64_norm, nonzero_and_norm
from inspector.memory.allocations import ours
from inspector.tracebacks import INTERNAL_NOTE, inspector_fault
from inspector.tracebacks import user_location as exc_location

if TYPE_CHECKING:
    from inspector.memory.merged import StepRecording

__all__ = [
    "GradStats", "BackwardRun", "InplaceError", "ForwardWatch", "OwnBackward", "backward_once",
    "grad_stats", "grad_norm", "AutogradGraph", "autograd_graph",
]  # fmt: skip


@dataclass
class GradStats:
    norm: float  # over the finite entries
    zero_fraction: float
    nan_count: int
    inf_count: int


@dataclass
class InplaceError:
    message: str
    op: str | None = None  # the in-place op that overwrote a saved tensor
    module: str | None = None
    location: str | None = None
    source_line: str | None = None
    forward_op: str | None = None  # the op whose saved tensor was overwritten
    forward_location: str | None = None


@dataclass
class BackwardRun:
    loss: str = ""
    loss_value: float | None = None
    backward_ran: bool = False
    no_grad_path: bool = False  # forward ran, but nothing trainable reaches the loss
    grads: dict[str, GradStats] = field(default_factory=dict)  # params whose grad is set
    called: list[str] = field(default_factory=list)  # module paths, first-call order
    used: list[str] = field(default_factory=list)  # parameter names, first-use order
    scale_free: set[str] = field(default_factory=set)  # layers feeding a normalisation
    cuts: list[CutPoint] = field(default_factory=list)
    inplace: list[InplaceOp] = field(default_factory=list)
    outputs_without_grad: list[str] = field(default_factory=list)
    error: str | None = None
    inplace_error: InplaceError | None = None
    internal: bool = False  # `error` is the inspector's own failure, not the model's


def grad_stats(grad: torch.Tensor) -> GradStats:
    g = grad.detach()
    nonzero, norm = nonzero_and_norm(g)
    zero = 1.0 - nonzero / g.numel() if g.numel() else 0.0
    if math.isfinite(norm):  # the common case: no NaN/Inf to count
        return GradStats(norm, zero, 0, 0)
    finite = torch.isfinite(g)
    nan = int(torch.isnan(g).sum())
    return GradStats(_finite_norm(g, finite), zero, nan, int((~finite).sum()) - nan)


def grad_norm(grad: torch.Tensor) -> tuple[float, bool]:
    """(the float64 norm of the finite values, whether any is NaN or Inf): what a node's
    gradient reports. No zero count, which only the parameters' rows show (ResNet-18's
    69 node gradients, 70 M values: 0.03 s of the gradients pass)."""
    g = grad.detach()
    norm = float64_norm(g)
    if math.isfinite(norm):
        return norm, False
    return _finite_norm(g, torch.isfinite(g)), True


def _finite_norm(g: torch.Tensor, finite: torch.Tensor) -> float:
    return float64_norm(torch.where(finite, g, 0))


class ForwardWatch(Protocol):
    """Another pass's observer of this forward (the modes pass's train() run)."""

    def watching(self, ctx: Context) -> AbstractContextManager[None]: ...

    def finish(self, output: Any) -> None: ...


# A backward of another pass's own, in place of the eager one (the per-node replay): called
# with the eager loss (its value, its autograd graph, the outputs the default loss was
# formed from: None under the user's loss_fn) once the eager graph is released; True when
# it ran and filled the same parameters' grads.
OwnBackward = Callable[[float, "AutogradGraph", "tuple[LossOutput, ...] | None"], bool]


def backward_once(
    ctx: Context,
    watch: ForwardWatch | None = None,
    backward: Callable[[], OwnBackward | None] | None = None,
    step: StepRecording | None = None,
) -> BackwardRun:
    """The eager forward under the recorders, the loss, and the backward: the eager one,
    or the one `backward()` gives once the forward has run, where it runs (one forward
    and backward fewer for the report). Where it does not, the eager forward and
    backward run again: their error is the answer. `step`: the forward and backward
    recorded as the measured training step's (inspector/memory/merged.py)."""
    if step is None:
        return _backward_once(ctx, watch, backward, None)
    with step.session():
        return _backward_once(ctx, watch, backward, step)


def _backward_once(
    ctx: Context,
    watch: ForwardWatch | None,
    backward: Callable[[], OwnBackward | None] | None,
    step: StepRecording | None,
) -> BackwardRun:
    run = BackwardRun()
    model = ctx.model
    for param in model.parameters():
        param.grad = None
    seeded(ctx.options.seed)
    try:
        with (
            recording(model, ctx.loaded.user_files) as rec,
            feeding_normalisation(model) as fed,
            watch.watching(ctx) if watch is not None else nullcontext(),
        ):
            if step is not None:
                step.begin()
            output = ctx.inputs.call(model)
    except Exception as exc:  # noqa: BLE001 - the user's forward; reported, not raised
        run.internal = inspector_fault(exc)
        note = f" ({INTERNAL_NOTE})" if run.internal else ""
        run.error = f"forward failed{_at(ctx, exc)}: {type(exc).__name__}: {exc}{note}"
        return run
    if watch is not None:
        with ours():
            watch.finish(output)
    run.called, run.cuts, run.inplace = list(rec.called), rec.cuts, rec.inplace
    run.used = list(rec.used)
    run.scale_free = fed.layers()
    if any(p.requires_grad for p in model.parameters()):
        run.outputs_without_grad = [k for k, t in float_outputs(output) if not t.requires_grad]
    user_loss = ctx.loaded.loss_fn is not None
    try:  # the default loss is ours: a recorded step counts the one it would form
        with _in_loss(rec, user_loss), nullcontext() if user_loss else ours():
            loss, run.loss = make_loss(output, ctx.inputs, ctx.loaded.loss_fn)
    except Exception as exc:  # noqa: BLE001 - the user's loss_fn
        run.error = f"loss_fn(output, inputs) failed{_at(ctx, exc)}: {type(exc).__name__}: {exc}"
        return run
    if loss is None:
        run.error = run.loss
        return run
    if not loss.requires_grad:
        run.no_grad_path = True
        cut = next((c for c in run.cuts if c.params), None)
        by = f": the path is cut by {cut.describe()}" if cut else ""
        run.error = f"the loss does not require grad: no parameter gradient reaches it{by}"
        return run
    if step is not None:
        _refused_loss(step, output, run.loss, user_loss)
    formed = None if user_loss else loss_outputs(output)
    del output  # as a training step drops it once its loss is formed
    if step is not None:  # the default loss, ours, stands for the step's: a float32 scalar
        step.loss_formed(0 if user_loss else torch.finfo(torch.float32).bits // 8)
    run.loss_value = float(loss.detach())
    own = backward() if backward is not None else None
    if own is not None:
        if step is not None:
            step.refuse("the per-node replay's backward ran")
        graph = autograd_graph(loss)
        del loss  # the eager graph goes before the other forward
        if own(run.loss_value, graph, formed):
            run.backward_ran = True
            run.grads = _grad_stats(model)
            return run
        for param in model.parameters():
            param.grad = None
        return backward_once(ctx)
    try:
        with step.backward() if step is not None else nullcontext():
            loss.backward()
        run.backward_ran = True
    except RuntimeError as exc:
        run.internal = inspector_fault(exc)
        run.error = _backward_error(ctx, exc, run)
        if step is not None:
            step.refuse("the backward failed")
    if step is not None:
        step.finish(loss if user_loss else None)
    run.grads = _grad_stats(model)
    return run


def _refused_loss(step: StepRecording, output: Any, formed: str, user_loss: bool) -> None:
    """Where the loss (`formed`: how) is not the measured step's, say so: the step refuses
    a loss_fn's non-scalar loss, and its default loss, the outputs' means, allocates by
    their dtype."""
    if user_loss:
        if formed != "loss_fn(output, inputs)":
            step.refuse("the loss_fn's loss is not a scalar")
        return
    dtypes = {t.dtype for _, t in float_outputs(output) if t.numel() and t.requires_grad}
    if dtypes != {torch.float32}:
        step.refuse("an output the loss is formed from is not float32")


def _grad_stats(model: torch.nn.Module) -> dict[str, GradStats]:
    return {n: grad_stats(p.grad) for n, p in model.named_parameters() if p.grad is not None}


@dataclass(frozen=True)
class AutogradGraph:
    """What a loss's backward will do: the leaves it fills (parameters, inputs: by id) and
    how many nodes of each kind it runs. Two forwards whose losses have the same graph
    give the same grads; a custom autograd.Function or a `torch.no_grad()` block that an
    fx graph does not keep shows up as another count or other leaves."""

    leaves: frozenset[int]
    nodes: tuple[tuple[str, int], ...]  # (node type, count), sorted


def autograd_graph(loss: torch.Tensor) -> AutogradGraph:
    found: set[int] = set()
    kinds: dict[str, int] = {}
    seen: set[int] = set()
    stack = [loss.grad_fn] if loss.grad_fn is not None else []
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        kind = type(fn).__name__
        kinds[kind] = kinds.get(kind, 0) + 1
        variable = getattr(fn, "variable", None)  # AccumulateGrad: a leaf's grad
        if variable is not None:
            found.add(id(variable))
        stack.extend(next_fn for next_fn, _ in fn.next_functions if next_fn is not None)
    return AutogradGraph(frozenset(found), tuple(sorted(kinds.items())))


@contextmanager
def _in_loss(rec: ForwardRecorder, record: bool) -> Iterator[None]:
    """The recorder again over the user's loss_fn, so a cut there gets its line."""
    if not record:
        yield
        return
    rec.in_loss = True
    with rec:
        yield


def _at(ctx: Context, exc: BaseException) -> str:
    where = exc_location(exc, ctx.loaded.user_files)
    return f" at {where[0]}" if where else ""


def _backward_error(ctx: Context, exc: RuntimeError, run: BackwardRun) -> str:
    if "modified by an inplace operation" not in str(exc):
        return f"backward failed{_at(ctx, exc)}: {exc}"
    run.inplace_error = diagnose_inplace(ctx, exc, run.inplace)
    return run.inplace_error.message


_PRODUCER = re.compile(r"output \d+ of (\w+?)(?:Backward\d*)?[,\s]")
_DETECTED = re.compile(r"Error detected in (\w+?)(?:Backward\d*)?\. Traceback")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in \S+\n\s+(.*)')


def diagnose_inplace(ctx: Context, exc: RuntimeError, ops: list[InplaceOp]) -> InplaceError:
    """Name the in-place op that overwrote a tensor backward needs, and where."""
    match = _PRODUCER.search(str(exc))
    producer = match.group(1) if match else None
    detected, fwd_location = _anomaly_trace(ctx)
    producer = producer or detected
    culprit = next((op for op in ops if _strip(op.target_grad_fn) == producer), None)
    culprit = culprit or (ops[-1] if ops else None)
    info = InplaceError(message="", forward_op=producer, forward_location=fwd_location)
    if culprit is not None:
        info.op, info.module = culprit.op, culprit.module
        info.location, info.source_line = culprit.location, culprit.source_line
    info.message = _inplace_message(info)
    return info


def _strip(grad_fn: str | None) -> str | None:
    return re.sub(r"Backward\d*$", "", grad_fn) if grad_fn else None


def _inplace_message(info: InplaceError) -> str:
    what = f"the in-place `{info.op}`" if info.op else "an in-place operation"
    where = f" at {info.location}" if info.location else ""
    module = f" in module '{info.module or '(root)'}'" if info.op else ""
    line = f" (`{info.source_line}`)" if info.source_line else ""
    saved = f"the output of `{info.forward_op}`" if info.forward_op else "a tensor"
    fwd = f" computed at {info.forward_location}" if info.forward_location else ""
    return (
        f"backward failed: {what}{where}{module}{line} overwrote {saved}{fwd}, "
        "which autograd saved for the backward pass"
    )


def _anomaly_trace(ctx: Context) -> tuple[str | None, str | None]:
    """Rerun under anomaly mode: (failing backward op, user location of its forward)."""
    model = ctx.model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly(check_nan=False):
                seeded(ctx.options.seed)
                loss, _ = make_loss(ctx.inputs.call(model), ctx.inputs, ctx.loaded.loss_fn)
                loss.backward()
        except RuntimeError:
            pass
    for param in model.parameters():
        param.grad = None
    text = next((str(w.message) for w in caught if "Error detected in" in str(w.message)), "")
    detected = _DETECTED.search(text)
    frames = [(f, int(n), src) for f, n, src in _FRAME.findall(text)]
    frames = [fr for fr in frames if is_user_file(fr[0], ctx.loaded.user_files)]
    location = f"{os.path.basename(frames[-1][0])}:{frames[-1][1]}" if frames else None
    return (detected.group(1) if detected else None), location
