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


GAP_SHARE = 0.05  # a measured gap past this is worth a warning, whatever its cause
GAP_BYTES = 1 << 20  # ...unless it is smaller than this: no budget is decided by a few KiB


@rule("kernel-memory-unmodelled", "info")
def kernel_memory_unmodelled(ctx: Context, report: Report) -> Iterator[Finding]:
    """Kernels that allocate memory of their own (workspaces, scratchpads, layout copies)
    that the estimate does not count: it says which, rather than silently under-count."""
    ops = report.memory.unmodelled_kernel_ops
    if ops:
        yield finding(
            "kernel-memory-unmodelled",
            "",
            f"the memory estimate leaves out what these kernels allocate inside themselves: "
            f"{', '.join(ops)}{_run_time(ops)}; the peaks may be that much higher.",
            "Leave the real measurement on (no --no-measure, no --fake) to see the gap, and "
            "keep headroom in the budget for it.",
        )


def _run_time(ops: list[str]) -> str:
    if any(op.startswith(("cudnn", "_cudnn", "miopen")) or "(cuda)" in op for op in ops):
        return " (on CUDA, cuDNN chooses its algorithm and workspace at run time)"
    return ""


@rule("memory-estimate-gap", "warning")
def memory_estimate_gap(ctx: Context, report: Report) -> Iterator[Finding]:
    """The report's own real measurement disagrees with the estimate by more than 5%: the
    gap, where the estimate peaks, and the likely cause."""
    measured = report.memory.measured
    if measured is None:
        return
    gaps = [
        (name, error)
        for name, error, size in (
            ("training-step peak", measured.train_peak_error, measured.train_peak_bytes),
            ("saved activations", measured.saved_activation_error, measured.saved_activation_bytes),
            ("inference forward peak", measured.forward_peak_error, measured.forward_peak_bytes),
        )
        if error is not None and abs(error) > GAP_SHARE and abs(error) * (size or 0) >= GAP_BYTES
    ]
    if gaps:
        text = ", ".join(f"the {name} is {error:+.1%} off" for name, error in gaps)
        yield finding(
            "memory-estimate-gap",
            report.memory.train_peak_node or "",
            f"measured on a real {measured.device} step ({measured.method}), {text} "
            f"(estimate vs measured). Likely cause: {_cause(report)}.",
            "Budget from the measured figures (memory.measured) for this model.",
            # A gap the report already explains (kernels it names as not modelled, in
            # kernel-memory-unmodelled; a step that varies with its draws) is a note; an
            # unexplained one is a warning.
            severity="info" if _explained(report) else "warning",
        )


def _explained(report: Report) -> bool:
    return bool(report.memory.unmodelled_kernel_ops or report.memory.train_peak_by_seed)


def _cause(report: Report) -> str:
    by_seed = report.memory.train_peak_by_seed
    if by_seed:
        return (
            "a step whose memory depends on its random draws (as layerdrop skips layers): "
            f"peaks from {min(by_seed.values()):,} to {max(by_seed.values()):,} B over seeds "
            f"{', '.join(by_seed)}, and the measured step took its own"
        )
    ops = report.memory.unmodelled_kernel_ops
    if ops:
        return f"memory allocated inside kernels the estimate does not model ({', '.join(ops)})"
    return (
        "allocations below the aten-op level that no formula in inspector/memory/kernels "
        "describes (a kernel's workspace or layout copies), or a model that runs another "
        "path on fake tensors than on real ones"
    )
