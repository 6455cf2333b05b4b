"""The rule registry: one small function per rule, registered with its id and severity.

A rule takes the Context and the Report and yields `Finding`s (built with `finding`, which
fills the registered severity unless the rule states another, e.g. info instead of warning
when a hazard only matters for a dtype the user did not pick).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from inspector.context import Context
from inspector.report import Finding, Report, Severity
from inspector.schema.findings import CRASHED_RULE, RULE_IDS, SEVERITY_ORDER

__all__ = ["Rule", "RULES", "rule", "finding", "run_rules", "SEVERITY_ORDER"]

Check = Callable[[Context, Report], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    check: Check
    doc: str


RULES: dict[str, Rule] = {}


def rule(rule_id: str, severity: Severity) -> Callable[[Check], Check]:
    """Register `check` under `rule_id`; a second rule with the same id, or an id missing
    from `inspector.schema.findings.RULE_THEMES` (the public list), is a bug."""
    if rule_id not in RULE_IDS:
        raise ValueError(f"rule {rule_id!r} is not listed in inspector/schema/findings.py")
    if severity not in SEVERITY_ORDER:
        raise ValueError(f"rule {rule_id!r}: unknown severity {severity!r}")

    def register(check: Check) -> Check:
        if rule_id in RULES:
            raise ValueError(f"rule {rule_id!r} is already registered")
        RULES[rule_id] = Rule(rule_id, severity, check, (check.__doc__ or "").strip())
        return check

    return register


def finding(
    rule_id: str, where: str, message: str, fix: str = "", severity: Severity | None = None
) -> Finding:
    return Finding(
        rule=rule_id,
        severity=severity or RULES[rule_id].severity,
        where=where,
        message=message,
        fix=fix,
    )


def run_rules(ctx: Context, report: Report | None = None) -> list[Finding]:
    """Every registered rule's findings, errors first. A rule that crashes is our bug:
    it becomes an info finding rather than losing the rest of the report."""
    report = report or ctx.report
    found: list[Finding] = []
    for item in RULES.values():
        try:
            found.extend(item.check(ctx, report))
        except Exception as exc:  # noqa: BLE001 - one broken rule must not hide the others
            message = f"rule {item.id} could not run: {type(exc).__name__}: {exc}"
            found.append(Finding(rule=CRASHED_RULE, severity="info", where="", message=message))
    return sorted(found, key=lambda f: SEVERITY_ORDER[f.severity])
