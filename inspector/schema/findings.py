"""Findings: the severities and every rule id, by theme.

Rule ids are a public contract (CI gates on them, `inspector submit --fail-on`), so the
list lives here, torch-free: the library's registry refuses a rule whose id is not listed
(`inspector.rules.registry.rule`), and the pages read the themes (e.g. which findings are
numeric health) without importing the rules, which need torch.
"""

from __future__ import annotations

__all__ = [
    "SEVERITIES",
    "SEVERITY_ORDER",
    "RULE_THEMES",
    "RULE_IDS",
    "CRASHED_RULE",
    "PROBLEM_VERDICTS",
    "rules_of",
]

SEVERITIES = ("error", "warning", "info")  # most severe first
SEVERITY_ORDER = {s: i for i, s in enumerate(SEVERITIES)}

# theme (the module of inspector/rules/ that holds them) -> rule ids
RULE_THEMES: dict[str, tuple[str, ...]] = {
    "capture": ("capture-failed", "values-not-computed"),
    "compile": ("compile-graph-break",),
    "distributed": ("ddp-unused-parameters",),
    "export": ("export-failed", "export-mismatch"),
    "gradients": (
        "grad-path-cut",
        "unused-parameter",
        "output-without-grad",
        "vanishing-gradient",
        "exploding-gradient",
        "nan-gradient",
        "inplace-autograd",
        "gradients-failed",
    ),
    "loss": ("softmax-before-cross-entropy",),
    "memory": (
        "checkpoint-candidate",
        "attention-materialized",
        "kernel-memory-unmodelled",
        "memory-estimate-gap",
    ),
    "modes": (
        "batchnorm-single-value",
        "batchnorm-few-values",
        "train-mode-failure",
        "mode-divergence",
        "eval-nondeterministic",
        "batchnorm-stats",
    ),
    "numerics": (
        "nan-activation",
        "dead-relu",
        "saturated-activation",
        "fp16-overflow",
        "bf16-precision",
        "softmax-saturated",
        "fp16-underflow",
    ),
    "structure": (
        "bias-before-batchnorm",
        "tensor-attribute",
        "mixed-devices",
        "mixed-dtypes",
        "inplace-read-later",
        "param-created-in-forward",
        "hardcoded-device",
        "data-parallel",
    ),
}
RULE_IDS = frozenset(rule for rules in RULE_THEMES.values() for rule in rules)
CRASHED_RULE = "rule-crashed"  # a rule that raised: our bug, reported as info

# Gradient verdicts (report.gradients.params[].verdict, .layers[].verdict) that are problems,
# and the rule whose finding reports each: a table shows a verdict as a problem only when
# the findings do too. The others: ok, frozen (not trained), gated (a near-zero layer scale
# or zero-initialised norm silences its block at initialisation, by design).
PROBLEM_VERDICTS: dict[str, str] = {
    "nan": "nan-gradient",
    "cut": "grad-path-cut",
    "unused": "unused-parameter",
    "vanishing": "vanishing-gradient",
    "exploding": "exploding-gradient",
}


def rules_of(theme: str) -> frozenset[str]:
    return frozenset(RULE_THEMES[theme])
