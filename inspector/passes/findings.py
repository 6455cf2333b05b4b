"""Findings: every registered lint rule over the finished report (runs last)."""

from __future__ import annotations

from inspector.context import Context
from inspector.rules import run_rules

__all__ = ["run"]


def run(ctx: Context) -> None:
    ctx.report.findings = run_rules(ctx)
