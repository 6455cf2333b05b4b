"""Rules on torch.compile readiness (the `compile` section): each graph break site."""

from __future__ import annotations

from collections.abc import Iterator

from inspector.context import Context
from inspector.report import Finding, GraphBreak, Report
from inspector.rules.registry import finding, rule

# The usual cure for each kind of break, by what torch names as its cause (lower case).
_CURES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("item", "tolist", "numpy", "scalar"),
     "Keep values as tensors in forward: no `.item()`, `.tolist()` or `.numpy()` (use "
     "`torch.where`, or `torch.cond` for a branch on a value), or set "
     "`torch._dynamo.config.capture_scalar_outputs = True`."),
    (("print", "logging", "logger", "warn"),
     "Move `print`/logging out of forward, or list the function in "
     "`torch._dynamo.config.reorderable_logging_functions`."),
    (("data-dependent", "data dependent", "jump", "branch"),
     "A Python `if` on a tensor's value: use `torch.cond` or `torch.where`."),
    (("nonzero", "dynamic output shape", "dynamic shape operator"),
     "An op whose output size depends on values (`nonzero`, boolean masks): set "
     "`torch._dynamo.config.capture_dynamic_output_shape_ops = True` or use a fixed-size op."),
)  # fmt: skip
_GENERAL = (
    "Usual cures: no `.item()`/`print`/`.numpy()` in forward, `torch.cond` for value "
    "branches, `torch._dynamo.mark_dynamic` for sizes that change, "
    "`torch.compiler.disable` on a helper that must stay Python."
)


@rule("compile-graph-break", "warning")
def compile_graph_break(ctx: Context, report: Report) -> Iterator[Finding]:
    """torch.compile splits the forward at this line: each break is a round trip to
    Python, fewer ops fused, and a recompile risk. Warning: it still runs, slower. A break
    inside a library, with none of the user's lines on the stack, is info: theirs to fix."""
    for item in report.compile.breaks:
        at = item.where or "an unknown line"
        code = f" (`{item.code}`)" if item.code else ""
        times = f" ({item.count} times)" if item.count > 1 else ""
        inside = "" if item.in_user_code else " inside a library, not in your code"
        yield finding(
            "compile-graph-break",
            item.where or "",
            f"torch.compile breaks the graph{inside} at {at}{code}{times}: {item.reason}",
            _cure(item) if item.in_user_code else _LIBRARY + _cure(item),
            severity=None if item.in_user_code else "info",
        )


_LIBRARY = (
    "Upgrade the library or wrap the call in torch.compiler.disable if it matters; otherwise: "
)


def _cure(item: GraphBreak) -> str:
    text = " ".join([item.op or "", item.reason, item.explanation or ""]).lower()
    for words, cure in _CURES:
        if any(word in text for word in words):
            return cure
    hint = f" torch: {item.hints[0]}" if item.hints else ""
    return _GENERAL + hint
