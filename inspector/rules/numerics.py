"""Rules on activation values (`Node.stats`, from the numerics pass)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from inspector.context import Context
from inspector.health.attention import SATURATED_PROB
from inspector.health.stats import FP16_MIN_NORMAL
from inspector.health.thresholds import resolve
from inspector.report import Finding, Node, NumericStats, Report
from inspector.rules.registry import finding, rule

_LIST = 5


def _stats(ctx: Context) -> list[tuple[str, str, NumericStats]]:
    """(node name, kind, stats) in forward order; empty when numerics did not run."""
    result = ctx.results.numerics
    if result is None or not result.computed:
        return []
    return [(name, result.kinds.get(name, ""), s) for name, s in result.stats.items()]


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - _LIST} more" if len(names) > _LIST else ""
    return ", ".join(names[:_LIST]) + more


@rule("nan-activation", "error")
def nan_activation(ctx: Context, report: Report) -> Iterator[Finding]:
    """The first node whose output holds NaN/Inf in the forward, when they reach the output.

    An Inf that never does is a mask: attention masks are -inf by design, and T5's
    `log(0)` is discarded by a `torch.where`. NaN is always reported.
    """
    stats = _stats(ctx)
    bad = [(name, s) for name, _, s in stats if s.nan_count or s.inf_count]
    if not bad:
        return
    output = stats[-1][2]
    if not any(s.nan_count for _, s in bad) and not output.inf_count:
        return  # Inf used as a mask: the output is finite
    first, s = bad[0]
    yield finding(
        "nan-activation",
        first,
        f"node '{first}' is the first to produce NaN/Inf ({s.nan_count} NaN, {s.inf_count} "
        "Inf); they reach the model's output.",
        "Check that node's inputs: division by zero, log/sqrt of non-positive values, "
        "overflow (exp of large values); add an epsilon or clamp.",
    )


@rule("dead-relu", "warning")
def dead_relu(ctx: Context, report: Report) -> Iterator[Finding]:
    """ReLU outputs with a large share of features zero for the whole batch."""
    limit = resolve(ctx.options)["dead_fraction"]
    for name, kind, s in _stats(ctx):
        if kind == "relu" and s.dead_fraction is not None and s.dead_fraction >= limit:
            yield finding(
                "dead-relu",
                name,
                f"{s.dead_fraction:.0%} of the features after '{name}' are zero for the whole "
                "batch (dead ReLU units): they pass no gradient.",
                "Check the initialisation and the bias of the layer before; consider "
                "LeakyReLU/GELU or a lower learning rate.",
            )


@rule("saturated-activation", "warning")
def saturated_activation(ctx: Context, report: Report) -> Iterator[Finding]:
    """Sigmoid/tanh outputs mostly within 1e-3 of their bounds (gradient ~ 0)."""
    limit = resolve(ctx.options)["saturated_fraction"]
    for name, kind, s in _stats(ctx):
        if s.saturated_fraction is not None and s.saturated_fraction >= limit:
            yield finding(
                "saturated-activation",
                name,
                f"{s.saturated_fraction:.0%} of the {kind} outputs of '{name}' lie within 1e-3 "
                "of its bounds, where its gradient vanishes.",
                "Scale the inputs down (normalisation before the activation, smaller "
                "initial weights).",
            )


@rule("fp16-overflow", "warning")
def fp16_overflow(ctx: Context, report: Report) -> Iterator[Finding]:
    """Activations beyond the float16 range (65504): inf under fp16 mixed precision."""
    nodes = [name for name, _, s in _stats(ctx) if s.fp16_overflow_count]
    if not nodes:
        return
    severity = "warning" if ctx.options.dtype == "fp16" else "info"
    yield finding(
        "fp16-overflow",
        nodes[0],
        f"{len(nodes)} node(s) produce values beyond the float16 range (|x| > 65504): "
        f"{_listed(nodes)}; under fp16 autocast they become inf.",
        "Use bf16 autocast instead, or keep these ops in float32 (autocast excludes "
        "them with `torch.autocast(..., enabled=False)`), or normalise earlier.",
        severity=severity,
    )


@rule("bf16-precision", "warning")
def bf16_precision(ctx: Context, report: Report) -> Iterator[Finding]:
    """Activations whose spread drowns in bfloat16 rounding (large offset, small spread)."""
    limit = resolve(ctx.options)["bf16_error"]
    nodes = [n for n, _, s in _stats(ctx) if s.bf16_error is not None and s.bf16_error > limit]
    if not nodes:
        return
    severity = "warning" if ctx.options.dtype == "bf16" else "info"
    yield finding(
        "bf16-precision",
        nodes[0],
        f"{len(nodes)} node(s) lose their signal in bfloat16 (rounding error above "
        f"{limit:.0%} of their spread): {_listed(nodes)}.",
        "Keep these values in float32 (subtract the offset first, or disable autocast "
        "around them).",
        severity=severity,
    )


@rule("softmax-saturated", "warning")
def softmax_saturated(ctx: Context, report: Report) -> Iterator[Finding]:
    """An attention softmax that is (nearly) one-hot at initialisation, or whose scores
    come from a matmul with no 1/sqrt(d) scale: its gradients vanish and training stalls."""
    for seen in ctx.results.attention_softmaxes:
        at = f" at {seen.location}" if seen.location else ""
        code = f" (`{seen.source_line}`)" if seen.source_line else ""
        share = seen.saturated_rows / seen.rows if seen.rows else 0.0
        problems = []
        if not seen.scaled:
            problems.append("its scores come straight from a matmul, with no 1/sqrt(d) scale")
        if not seen.fake and share > 0.5:
            problems.append(
                f"{share:.0%} of its {seen.rows:,} rows put more than "
                f"{SATURATED_PROB} of their weight on one position at initialisation"
            )
        if problems:
            yield finding(
                "softmax-saturated",
                seen.location or "",
                f"attention softmax{at}{code}: " + "; ".join(problems) + ".",
                "Scale the scores by 1/sqrt(head_dim) before the softmax, or use "
                "F.scaled_dot_product_attention (scaled, fused, and no S x S matrix kept).",
            )


# Share of a node's nonzero values below float16's normal range that makes it matter.
_UNDERFLOW_SHARE = 0.1
# What fp16 autocast runs in float16 (matmuls, convolutions); the rest keeps its input's
# dtype or runs in float32 (pow, exp, norms, softmax...), so only these outputs underflow.
_FP16_OPS = frozenset({
    "linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum", "__matmul__",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
})  # fmt: skip
_FP16_MODULES = frozenset({"Linear", "Conv1d", "Conv2d", "Conv3d", "Conv1D", "ConvTranspose1d",
                           "ConvTranspose2d", "ConvTranspose3d", "Bilinear"})  # fmt: skip


def _runs_in_fp16(node: Node | None) -> bool:
    if node is None:
        return False
    if node.op in ("call_module", "module"):
        return node.module_type in _FP16_MODULES
    return node.target.rpartition(".")[2] in _FP16_OPS


@rule("fp16-underflow", "warning")
def fp16_underflow(ctx: Context, report: Report) -> Iterator[Finding]:
    """Outputs of ops fp16 autocast runs in float16 (matmuls, convolutions) mostly below
    its normal range (0 < |x| < 6.1e-5): they lose their precision or flush to zero.
    Warning under --dtype fp16. Also norm layers whose eps the low-precision run rounds
    to zero where they add it to the variance (health/normeps.py)."""
    yield from _activations_underflow(ctx, report)
    yield from _norm_eps_lost(ctx)


def _activations_underflow(ctx: Context, report: Report) -> Iterator[Finding]:
    by_name = {n.name: n for n in report.nodes}
    nodes = [
        (name, s.fp16_underflow_fraction)
        for name, _, s in _stats(ctx)
        if s.fp16_underflow_fraction is not None
        and s.fp16_underflow_fraction > _UNDERFLOW_SHARE
        and _runs_in_fp16(by_name.get(name))
    ]
    if not nodes:
        return
    severity = "warning" if ctx.options.dtype == "fp16" else "info"
    name, share = nodes[0]
    yield finding(
        "fp16-underflow",
        name,
        f"{len(nodes)} node(s) hold values below float16's normal range "
        f"(0 < |x| < {FP16_MIN_NORMAL:.2g}): {_listed([n for n, _ in nodes])}; at '{name}' "
        f"{share:.0%} of the nonzero values, which fp16 autocast rounds off or flushes to zero.",
        "Use bf16 autocast (float32's range), rescale (a larger init or a normalisation "
        "before these ops), or keep them in float32; for gradients, torch.amp.GradScaler.",
        severity=severity,
    )


def _norm_eps_lost(ctx: Context) -> Iterator[Finding]:
    lost = ctx.results.lost_norm_eps
    if not lost:
        return
    dtype = lost[0].dtype
    info = torch.finfo(getattr(torch, dtype))
    subnormal = info.smallest_normal * info.eps  # float16: 2**-14 * 2**-10 = 6.0e-8
    named = _listed([f"'{x.path}' ({x.type}, eps={x.eps:g}, {x.input_dtype} input)" for x in lost])
    yield finding(
        "fp16-underflow",
        lost[0].path,
        f"{len(lost)} norm layer(s) lose their eps in {dtype}: {named}. {dtype} rounds an eps "
        f"below {subnormal / 2:.2g} (half its smallest subnormal) to 0 where these layers add "
        "it to the variance, so a row with zero variance (padding, a constant feature, values "
        "that underflowed) gives inf/NaN; each of them did on a zero-variance input here.",
        "Use eps >= 1e-5 (float16 keeps it to 0.6%), or compute the norm in float32: "
        "upcast its input (x.float(), as HF's RMSNorm does) or use nn.LayerNorm / "
        "nn.RMSNorm, which autocast runs with eps in float32.",
    )
