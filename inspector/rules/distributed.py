"""Rules on distributed training readiness: what DistributedDataParallel needs to know."""

from __future__ import annotations

from collections.abc import Iterator

from inspector.context import Context
from inspector.report import Finding, ParamGrad, Report
from inspector.rules.registry import finding, rule

_LIST = 8  # parameter names quoted in one message
# Verdicts of a trainable parameter whose .grad stayed None after the backward.
_NO_GRAD = ("unused", "cut")


def _names(rows: list[ParamGrad]) -> str:
    names = [r.name for r in rows]
    more = f" and {len(names) - _LIST} more" if len(names) > _LIST else ""
    return ", ".join(names[:_LIST]) + more


@rule("ddp-unused-parameters", "warning")
def ddp_unused_parameters(ctx: Context, report: Report) -> Iterator[Finding]:
    """DistributedDataParallel all-reduces every trainable parameter's gradient: one that
    gets none on a step stalls the reduction (an error on the next step) unless DDP is
    told. When every parameter gets one, say (info) that the defaults are safe."""
    grads = report.gradients
    run = ctx.results.gradients
    if not grads.computed or run is None or not run.backward_ran:
        return
    trainable = [p for p in grads.params if p.verdict != "frozen"]
    missing = [p for p in trainable if p.verdict in _NO_GRAD]
    if missing:
        yield finding(
            "ddp-unused-parameters",
            "",
            f"{len(missing)} of {len(trainable)} trainable parameters get no gradient on this "
            f"sample ({_names(missing)}): DistributedDataParallel with its default "
            "find_unused_parameters=False fails at the next step ('Expected to have finished "
            "reduction in the prior iteration').",
            "Remove the parameters or freeze them (requires_grad_(False)); else wrap with "
            "DistributedDataParallel(model, find_unused_parameters=True), which walks the "
            "autograd graph after every forward (a few % slower). If the same ones are unused "
            "on every step, static_graph=True avoids that walk.",
        )
        return
    yield finding(
        "ddp-unused-parameters",
        "",
        f"All {len(trainable)} trainable parameters get a gradient on this sample: "
        "DistributedDataParallel's default find_unused_parameters=False is safe for this "
        f"input (an input that takes another branch may leave some out). {_static(ctx)}",
        "Keep find_unused_parameters=False (the default): it is the fast path.",
        severity="info",
    )


def _static(ctx: Context) -> str:
    """static_graph=True applies when every step runs the same graph."""
    capture = ctx.capture
    branches = capture.decisions if capture is not None else []
    if branches:
        return (
            f"static_graph=True applies only if the {len(branches)} branch(es) forward takes "
            "on tensor values go the same way on every step."
        )
    if capture is not None and capture.method in ("fx", "export"):
        return (
            "The forward traced as one graph with no branch on tensor values, so "
            "static_graph=True applies (the same parameters and graph every step)."
        )
    return (
        "static_graph=True applies when every step uses the same parameters in the same "
        "graph (no branch on tensor values or on the step)."
    )
