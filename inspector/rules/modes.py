"""Rules on train vs eval behaviour (the `modes` section)."""

from __future__ import annotations

from collections.abc import Iterator

from inspector.context import Context
from inspector.health.modecheck import BatchNormInput
from inspector.health.thresholds import resolve
from inspector.report import Finding, Node, Report
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


# Graph ops that draw random numbers (call_function / call_method targets).
_RANDOM_OPS = frozenset({
    "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
    "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli",
    "normal", "multinomial", "randperm", "uniform_", "normal_", "bernoulli_",
})  # fmt: skip


def _random_node(report: Report) -> Node | None:
    """The first graph op that draws random numbers (modules such as nn.Dropout are
    call_module nodes, off in eval, and not counted)."""
    for node in report.nodes:
        random = node.target.rpartition(".")[2] in _RANDOM_OPS
        if random and node.op in ("call_function", "call_method"):
            return node
    return None


@rule("eval-nondeterministic", "warning")
def eval_nondeterministic(ctx: Context, report: Report) -> Iterator[Finding]:
    """Two eval() forwards with different seeds differ: randomness stays on in eval, so
    validation scores and inference are noisy."""
    modes = report.modes
    shows = modes.eval_first_differing_node
    if not modes.computed or shows is None:
        return
    cause = _random_node(report)
    node = cause.name if cause is not None else shows
    at = f" ({cause.location})" if cause is not None and cause.location else ""
    seen = f" (the difference shows first at '{shows}')" if cause is not None else ""
    yield finding(
        "eval-nondeterministic",
        node,
        f"two eval() forwards with different seeds differ by up to "
        f"{modes.eval_max_abs_diff or 0:.3g}: '{node}'{at} draws random numbers in eval "
        f"mode{seen}.",
        "Pass training=self.training to F.dropout (or use nn.Dropout), and draw no random "
        "numbers in forward when not self.training.",
    )


# Batch variance this many times the running variance: eval() normalises with stale stats.
_VAR_RATIO = 10.0


@rule("batchnorm-stats", "warning")
def batchnorm_stats(ctx: Context, report: Report) -> Iterator[Finding]:
    """eval() normalises with BatchNorm's running statistics: a warning when they are far
    from the sample's (batch variance > 10x the running one), info when they are still
    the defaults (mean 0, var 1: an untrained or freshly built model)."""
    stale = [b for b in _batchnorm(ctx) if b.stats_at_defaults is False]
    for bn in stale:
        if bn.batch_var_ratio is not None and bn.batch_var_ratio > _VAR_RATIO:
            yield finding(
                "batchnorm-stats",
                bn.path,
                f"{bn.type} '{bn.path}': the sample's batch variance is up to "
                f"{bn.batch_var_ratio:.3g}x its running variance, so eval() normalises "
                "with statistics that do not match these inputs.",
                "Recompute the running stats on data like this (a few train-mode forwards "
                "under torch.no_grad(), or torch.optim.swa_utils.update_bn), and check the "
                "input preprocessing matches training.",
            )
    fresh = [b.path for b in _batchnorm(ctx) if b.stats_at_defaults]
    if fresh:
        listed = ", ".join(fresh[:5]) + (f" and {len(fresh) - 5} more" if len(fresh) > 5 else "")
        yield finding(
            "batchnorm-stats",
            fresh[0],
            f"{len(fresh)} BatchNorm layer(s) still have their default running stats "
            f"(mean 0, var 1): {listed}; eval() normalises with those, not with data "
            "statistics.",
            "Expected for a freshly built model; train it, or load its weights, before "
            "judging eval() outputs.",
            severity="info",
        )
