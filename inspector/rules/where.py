"""Find the report node that an event recorded in the user's forward belongs to."""

from __future__ import annotations

from inspector.report import Report

__all__ = ["node_at"]


def node_at(report: Report, location: str | None, op: str | None, module: str | None) -> str | None:
    """The node at `location` ("file.py:LINE") whose target names `op`, else the first
    node at that location, else the node calling `module`; None when nothing matches."""
    if location:
        here = [n for n in report.nodes if n.location == location]
        named = [n for n in here if op and op.rstrip("_") in n.target]
        if named or here:
            return (named or here)[0].name
    if module:
        return next(
            (
                n.name
                for n in report.nodes
                if n.module_path == module and n.op in ("call_module", "module")
            ),
            None,
        )
    return None
