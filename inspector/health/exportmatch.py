"""Does an exported model compute what the eager one does? Each target that exported is
run on the sample and, with each named dim changed alone, on other inputs, beside eager
(eval mode, no grad). torch.export's own program is static, so the changed dims run on an
export with the named dims left dynamic (Dim.AUTO): a dim it had to specialise shows up
as a failure there. ONNX is exported with those axes dynamic (passes/export.py) and run
in onnxruntime. A trace or an ONNX program that baked in a branch shows up as a
difference, one that baked in a size as a failure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from inspector.context import Context, Inputs
from inspector.graph.exportcapture import export_graph, flat_tensors, moving_axes
from inspector.graph.symdims import perturbed_value
from inspector.graph.tensors import tensor_leaves
from inspector.health.maxdiff import float32_max_abs_diff
from inspector.health.state import preserved, seeded
from inspector.report import ExportTarget

__all__ = [
    "check_target",
    "changed_inputs",
    "DynamicExport",
    "EagerOutputs",
    "RTOL",
    "eager_copies",
    "float_leaves",
]

RTOL = 1e-3  # of the largest eager value: float32 reordering stays far below it


def changed_inputs(ctx: Context) -> list[tuple[str, Inputs]]:
    """("B=4", inputs) for each named dim changed alone; none when the inputs are fixed."""
    out = []
    for name, value in ctx.inputs.dims.items():
        moved = perturbed_value(value)
        try:
            inputs = ctx.factory.build({**ctx.inputs.dims, name: moved}, device=ctx.options.device)
        except Exception:  # noqa: BLE001 - a factory without named dims: the sample only
            return []
        out.append((f"{name}={moved}", inputs))
    return out


class EagerOutputs:
    """The eager model's float outputs per input set, run once for all targets (eval mode,
    no grad, seeded: every target compares with the same values). The sample's is the
    modes pass's eval() run when it ran: the same forward (passes/modes.py)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._outputs: dict[int, tuple[Inputs, list[torch.Tensor]]] = {}
        if ctx.results.eval_output is not None:
            inputs, output = ctx.results.eval_output
            self._outputs[id(inputs)] = (inputs, eager_copies(output))

    def of(self, inputs: Inputs) -> list[torch.Tensor]:
        kept = self._outputs.get(id(inputs))
        if kept is None or kept[0] is not inputs:
            ctx = self.ctx
            with preserved(ctx.model), torch.no_grad():
                ctx.model.eval()
                seeded(ctx.options.seed)
                kept = (inputs, eager_copies(inputs.call(ctx.model)))
            self._outputs[id(inputs)] = kept
        return kept[1]


class DynamicExport:
    """The model exported non-strict with the named dims left dynamic (Dim.AUTO), at most
    once per report: every export target runs it at the changed dims, and it is the
    non-strict target's own program when it exports (passes/export.py). Called on
    inputs, it runs them, or raises the export's error."""

    def __init__(self, ctx: Context, others: list[tuple[str, Inputs]]) -> None:
        self.ctx, self.others = ctx, others
        self._built: tuple[Any, Exception | None] | None = None

    def axes(self) -> list[list[int]]:
        """For each flattened input tensor, the axes the changed dims move."""
        inputs = self.ctx.inputs
        base = flat_tensors(tuple(inputs.args), dict(inputs.kwargs))
        changed = [flat_tensors(tuple(i.args), dict(i.kwargs)) for _, i in self.others]
        return moving_axes(base, changed)

    def module(self) -> Any:
        if self._built is None:
            ctx = self.ctx
            args, kwargs = tuple(ctx.inputs.args), dict(ctx.inputs.kwargs)
            try:
                axes = self.axes()  # run, never read: no node needs the line that made it
                _, gm = export_graph(ctx.model, args, kwargs, dynamic=axes, stack_traces=False)
                self._built = (gm, None)
            except Exception as exc:  # noqa: BLE001 - said where the program is run
                self._built = (None, exc)
        gm, error = self._built
        if error is not None:
            raise error
        return gm

    def __call__(self, inputs: Inputs) -> Any:
        return self.module()(*flat_tensors(tuple(inputs.args), dict(inputs.kwargs)))


def check_target(
    ctx: Context,
    target: ExportTarget,
    artifact: Any,
    others: list[tuple[str, Inputs]],
    eager: EagerOutputs | None = None,
    dynamic: DynamicExport | None = None,
) -> None:
    """Fill `target.max_abs_diff`, `.checked` and `.mismatch`; `eager` and `dynamic`
    share the eager outputs and the dynamic export between the targets."""
    run = _runner(target.target, artifact)
    if run is None:
        return
    eager = eager or EagerOutputs(ctx)
    cases = [("sample", ctx.inputs, run)]
    if target.target.startswith("export") and others:
        dynamic = dynamic or DynamicExport(ctx, others)
        cases += [(label, inputs, dynamic) for label, inputs in others]
    elif not target.target.startswith("export"):
        cases += [(label, inputs, run) for label, inputs in others]
    worst = 0.0
    for label, inputs, call in cases:
        target.checked.append(label)
        problem, diff = _compare(ctx, inputs, call, eager)
        worst = max(worst, diff or 0.0)
        if problem and target.mismatch is None:
            target.mismatch = f"{label}: {problem}"
    target.max_abs_diff = worst


def _runner(name: str, artifact: Any) -> Callable[[Inputs], Any] | None:
    if isinstance(artifact, DynamicExport):
        return artifact
    if name.startswith("export"):
        module = artifact.module()
        return lambda inputs: module(*inputs.args, **inputs.kwargs)
    if name.startswith("torchscript"):
        return lambda inputs: artifact(*inputs.args, **inputs.kwargs)
    if name == "onnx":  # an ONNXProgram runs itself with onnxruntime
        return lambda inputs: artifact(*flat_tensors(tuple(inputs.args), dict(inputs.kwargs)))
    return None


def _compare(
    ctx: Context, inputs: Inputs, call: Callable[[Inputs], Any], eager: EagerOutputs
) -> tuple[str | None, float | None]:
    """(what is wrong or None, max |exported - eager|)."""
    expected = eager.of(inputs)
    with preserved(ctx.model), torch.no_grad():
        ctx.model.eval()
        try:
            seeded(ctx.options.seed)
            got = float_leaves(call(inputs))
        except Exception as exc:  # noqa: BLE001 - the exported model failing is the finding
            lines = str(exc).strip().splitlines() or [""]
            return f"fails: {type(exc).__name__}: {lines[0][:200]}", None
    if [a.shape for a in got] != [b.shape for b in expected]:
        return "the outputs' shapes differ from eager's", None
    pairs = zip(got, expected, strict=True)
    diff = max((_max_abs_diff(a, b) for a, b in pairs if a.numel()), default=0.0)
    scale = max((float(b.abs().max()) for b in expected if b.numel()), default=0.0)
    if diff > RTOL * max(scale, 1.0):
        return f"differs from eager by up to {diff:.3g} (largest eager value {scale:.3g})", diff
    return None, diff


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64 (NaN when either holds one)."""
    if a.dtype == b.dtype == torch.float32:
        found = float32_max_abs_diff(a, b)
        if found is not None:
            return found
    return float((a.double() - b.double()).abs().max())


def float_leaves(output: Any) -> list[torch.Tensor]:
    """The float outputs in their own dtype: compared as float64 computes (_max_abs_diff),
    without float64 copies."""
    return [t.detach() for t in tensor_leaves(output) if t.is_floating_point()]


def eager_copies(output: Any) -> list[torch.Tensor]:
    """Eager's float outputs, copied: kept for later comparisons, they must not follow a
    tensor the model updates in place on its next call (a static KV cache it returns)."""
    return [t.clone() for t in float_leaves(output)]
