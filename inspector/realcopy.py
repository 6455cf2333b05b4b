"""`--fake` on a model whose forward needs tensor values: run it on a real copy, when small.

Fake tensors have shapes but no values, so an op whose output size depends on the data
(`nonzero`, boolean masks, NMS in every torchvision detector) or a branch on a value has no
answer under them: capture, memory and gradients would all come back empty. A real copy
gives every number. It costs a real build and real forwards, which `--fake` exists to
avoid on big models, so it is taken only below a size where that cost is small; above it
the report stays fake and says why the numbers are missing.
"""

from __future__ import annotations

from torch import nn

from inspector.units import format_bytes

__all__ = ["REAL_COPY_MAX_BYTES", "needs_values", "real_copy_decision"]

# 1 GiB of weights (about 270M fp32 parameters): a detector or a ViT-L builds and runs in
# seconds on a CPU; a 7B decoder does not.
REAL_COPY_MAX_BYTES = 1 << 30


def needs_values(exc: BaseException) -> bool:
    """Whether a fake run failed because an op or a branch needed the tensors' values."""
    from torch._subclasses import fake_tensor as ft

    kinds = (ft.DataDependentOutputException, ft.DynamicOutputShapeException)
    return isinstance(exc, kinds) or type(exc).__name__ == "GuardOnDataDependentSymNode"


def _what(exc: BaseException) -> str:
    op = getattr(exc, "func", None)
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{op}" if op is not None else f"{type(exc).__name__}: {first[:160]}"


def real_copy_decision(exc: BaseException, model: nn.Module) -> tuple[bool, str]:
    """(use a real copy?, the report's warning saying what was done and why)."""
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    weights += sum(t.numel() * t.element_size() for t in model.buffers())
    why = f"the forward needs tensor values that fake tensors do not have ({_what(exc)})"
    if weights <= REAL_COPY_MAX_BYTES:
        return True, (
            f"--fake: {why}; the model ({format_bytes(weights)} of weights) was built and "
            "analysed for real instead, so every number comes from real tensors."
        )
    return False, (
        f"--fake: {why}, and at {format_bytes(weights)} of weights (above "
        f"{format_bytes(REAL_COPY_MAX_BYTES)}) a real copy is not built: passes that run the "
        "model may have no numbers. Run without --fake on a machine that holds the model."
    )
