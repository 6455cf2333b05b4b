"""Rules on activation memory (from the memory pass, when it ran)."""

from __future__ import annotations

from collections.abc import Iterator

from inspector.context import Context
from inspector.health.thresholds import resolve
from inspector.report import Finding, MemoryAdvice, Report
from inspector.rules.registry import finding, rule
from inspector.units import format_bytes


@rule("checkpoint-candidate", "info")
def checkpoint_candidate(ctx: Context, report: Report) -> Iterator[Finding]:
    """Activation checkpointing that frees a large share of the saved activations. The
    numbers are the memory pass's advice (run on fake tensors where it could be), so the
    finding, the advice list and the set-ups table agree."""
    total = report.memory.saved_activation_bytes
    if not total:
        return
    share = resolve(ctx.options)["checkpoint_share"]
    advice = report.memory.advice
    best = max((a for a in advice if a.kind == "checkpoint"), key=_saving, default=None)
    every = next((a for a in advice if a.kind == "checkpoint-all"), None)
    if every is not None and every.saving_bytes >= share * total:
        single = f"; the largest single block, '{best.where}', frees {_bytes(best)}" if best else ""
        yield finding(
            "checkpoint-candidate",
            best.where if best else "",
            f"checkpointing every block frees {_bytes(every)} ({every.saving_bytes / total:.0%} "
            f"of the saved activations{_how(every)}){single}.",
            _FIX,
        )
    elif best is not None and best.saving_bytes >= share * total:
        yield finding(
            "checkpoint-candidate",
            best.where or "",
            f"checkpointing '{best.where}' frees {_bytes(best)} "
            f"({best.saving_bytes / total:.0%} of the saved activations{_how(best)}).",
            _FIX,
        )


_FIX = (
    "Wrap each block's call in torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)"
    " (Hugging Face models: model.gradient_checkpointing_enable())."
)


def _saving(advice: MemoryAdvice) -> int:
    return advice.saving_bytes


def _bytes(advice: MemoryAdvice) -> str:
    return format_bytes(advice.saving_bytes)


def _how(advice: MemoryAdvice) -> str:
    return ", measured on fake tensors" if advice.verified else ", predicted"


@rule("attention-materialized", "info")
def attention_materialized(ctx: Context, report: Report) -> Iterator[Finding]:
    """The model's own attention builds the S x S probability matrix, which backward
    keeps: F.scaled_dot_product_attention (flash / memory-efficient kernels) keeps none."""
    sites = ctx.results.attention_softmaxes
    total = sum(s.bytes for s in sites)
    if not total:
        return
    first = sites[0]
    calls = sum(s.calls for s in sites)
    shape = "x".join(str(d) for d in first.shape or [])
    share = ""
    saved = report.memory.saved_activation_bytes
    if saved:
        share = f" ({total / saved:.0%} of the {format_bytes(saved)} saved for backward)"
    yield finding(
        "attention-materialized",
        first.location or "",
        f"{calls} attention softmax call(s) build their probability matrices (first "
        f"[{shape}] at {first.location or 'an unknown line'}): backward keeps at least "
        f"{format_bytes(total)} of them per step{share}.",
        "Use F.scaled_dot_product_attention(q, k, v, attn_mask=..., is_causal=...): its "
        f"fused kernels keep no S x S matrix, saving about {format_bytes(total)} here, and "
        "it applies the 1/sqrt(d) scale.",
    )
