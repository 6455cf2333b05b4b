"""Rules on how the loss is computed from the model's output (passes/probe.py)."""

from __future__ import annotations

from collections.abc import Iterator

from inspector.context import Context
from inspector.health.lossops import LossCall
from inspector.report import Finding, Report
from inspector.rules.registry import finding, rule

_RULE = "softmax-before-cross-entropy"


@rule(_RULE, "warning")
def softmax_before_cross_entropy(ctx: Context, report: Report) -> Iterator[Finding]:
    """A loss given the wrong kind of input: cross_entropy on probabilities (it applies
    log_softmax itself), nll_loss on anything but log-probabilities, binary_cross_entropy
    on anything but a sigmoid. It trains, badly: gradients shrink, the loss is wrong."""
    for call in ctx.results.loss_calls:
        problem = _problem(call)
        if problem is None:
            continue
        message, fix = problem
        at = f" at {call.location}" if call.location else ""
        code = f" (`{call.source_line}`)" if call.source_line else ""
        yield finding(_RULE, call.location or "", f"{call.loss}{at}{code}: {message}", fix)


def _problem(call: LossCall) -> tuple[str, str] | None:
    made = call.input_from
    if call.loss == "cross_entropy" and made in ("softmax", "log_softmax"):
        return (
            f"its input comes from {made}, but cross_entropy applies log_softmax itself: "
            "the probabilities are normalised twice and the gradients shrink.",
            f"Give cross_entropy the logits: drop the {made} before the loss (keep it for "
            "inference only).",
        )
    if call.loss == "nll_loss" and made in ("softmax", "sigmoid"):
        return (
            f"its input comes from {made}: nll_loss expects log-probabilities.",
            "Use log_softmax instead of softmax, or cross_entropy on the logits.",
        )
    if call.loss == "binary_cross_entropy" and made != "sigmoid":
        where = f"comes from {made}" if made else "is not a sigmoid output"
        return (
            f"its input {where}: binary_cross_entropy needs probabilities, and it is "
            "unsafe under autocast.",
            "Give the logits to binary_cross_entropy_with_logits (nn.BCEWithLogitsLoss): "
            "numerically stable and autocast-safe.",
        )
    return None
