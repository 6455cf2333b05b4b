"""Lint rules over a finished report: `run_rules(ctx)` -> findings. Each theme module
registers its rules on import (see `registry`)."""

from __future__ import annotations

from inspector.rules import (  # noqa: F401 - each module registers its rules
    capture,
    compile,
    distributed,
    export,
    gradients,
    loss,
    memory,
    modes,
    numerics,
    structure,
)
from inspector.rules.registry import RULES, Rule, finding, rule, run_rules

__all__ = ["RULES", "Rule", "finding", "rule", "run_rules"]
