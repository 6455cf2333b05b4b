"""Rules on train vs eval behaviour (the `modes` section)."""

from __future__ import annotations

from collections.abc import Iterator

from inspector.context import Context
from inspector.health.modecheck import BatchNormInput
from inspector.health.thresholds import resolve
from inspector.report import Finding, Report
from inspector.rules.registry import finding, rule

_BN_FIX = (
    "Use a batch with more samples (or larger spatial maps), switch to GroupNorm / "
    "LayerNorm, or keep this BatchNorm in eval() mode."
)


def _batchnorm(ctx: Context) -> list[BatchNormInput]:
    return list(ctx.results.batchnorm_inputs.values())


@rule("batchnorm-single-value", "error")
def batchnorm_single_value(ctx: Context, report: Report) -> Iterator[Finding]:
    """BatchNorm in train mode sees one value per channel: no batch statistics exist."""
    for bn in _batchnorm(ctx):
        if bn.values_per_channel <= 1:
            yield finding(
                "batchnorm-single-value",
                bn.path,
                f"{bn.type} '{bn.path}' gets input {bn.shape} in train mode: one value per "
                "channel (batch 1 with 1x1 spatial, or batch 1 for 1-d), so training fails "
                "('Expected more than 1 value per channel when training').",
                _BN_FIX,
            )


@rule("batchnorm-few-values", "warning")
def batchnorm_few_values(ctx: Context, report: Report) -> Iterator[Finding]:
    """BatchNorm in train mode computes statistics over very few values per channel."""
    limit = resolve(ctx.options)["bn_min_values"]
    for bn in _batchnorm(ctx):
        if 1 < bn.values_per_channel < limit:
            yield finding(
                "batchnorm-few-values",
                bn.path,
                f"{bn.type} '{bn.path}' gets input {bn.shape} in train mode: its batch "
                f"statistics come from {bn.values_per_channel} values per channel, too few "
                "to be stable.",
                _BN_FIX,
            )


@rule("train-mode-failure", "warning")
def train_mode_failure(ctx: Context, report: Report) -> Iterator[Finding]:
    """The forward fails in one of train()/eval() mode (BatchNorm causes reported apart)."""
    error = report.modes.error
    if not error or ctx.options.fake or any(b.values_per_channel <= 1 for b in _batchnorm(ctx)):
        return
    if ctx.results.modes_internal:  # the inspector failed, not the model: no finding
        return
    yield finding(
        "train-mode-failure", "", error, "Make forward work in both train() and eval() mode."
    )


@rule("mode-divergence", "info")
def mode_divergence(ctx: Context, report: Report) -> Iterator[Finding]:
    """Outputs differ between train() and eval(): which modules, and where it starts."""
    modes = report.modes
    if not modes.computed or modes.first_divergent_node is None:
        return
    listed = ", ".join(p or "(root)" for p in modes.mode_dependent_modules[:5])
    more = len(modes.mode_dependent_modules) - 5
    listed += f" and {more} more" if more > 0 else ""
    yield finding(
        "mode-divergence",
        modes.first_divergent_node,
        f"train() and eval() outputs differ by up to {modes.output_max_abs_diff:.3g}; the "
        f"runs diverge first at '{modes.first_divergent_node or '(root)'}'. "
        f"Mode-dependent modules: {listed or 'none found'}.",
        "Expected with Dropout/BatchNorm; call model.eval() for inference and "
        "model.train() for training.",
    )
