"""Rules on activation memory (from the memory pass, when it ran)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from inspector.context import Context
from inspector.health.thresholds import resolve
from inspector.report import Finding, Module, Report
from inspector.rules.registry import finding, rule
from inspector.units import format_bytes

_ITEMSIZE = {
    "float64": 8,
    "int64": 8,
    "float32": 4,
    "int32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


def _output_bytes(module: Module) -> int:
    """Bytes of the module's own outputs (concrete shapes only)."""
    total = 0
    for shape, dtype in zip(module.output_shapes, module.output_dtypes, strict=False):
        if all(isinstance(d, int) for d in shape):
            total += math.prod(shape) * _ITEMSIZE.get(dtype.replace("torch.", ""), 4)
    return total


def _saving(module: Module) -> int:
    # Checkpointing keeps the block's output (the next block's input) and recomputes the
    # inside during backward.
    return max((module.saved_activation_bytes or 0) - _output_bytes(module), 0)


def _candidates(report: Report, total: int, share: float) -> list[Module]:
    """Called non-root modules holding `share` of the saved activations, deepest only."""
    big = [
        m
        for m in report.modules
        if m.path and m.calls != 0 and (m.saved_activation_bytes or 0) >= share * total
    ]
    paths = {m.path for m in big}
    return [m for m in big if not any(p.startswith(m.path + ".") for p in paths)]


def _block_groups(report: Report, total: int, share: float) -> list[tuple[str, list[Module]]]:
    """Same-type sibling blocks (e.g. transformer layers) that together hold `share`."""
    groups: dict[tuple[str | None, str], list[Module]] = {}
    for m in report.modules:
        if m.path and m.saved_activation_bytes:
            groups.setdefault((m.parent, m.type), []).append(m)
    found = []
    for (parent, _), members in groups.items():
        if len(members) >= 2 and sum(m.saved_activation_bytes for m in members) >= share * total:
            found.append((parent or "", members))
    return found


@rule("checkpoint-candidate", "info")
def checkpoint_candidate(ctx: Context, report: Report) -> Iterator[Finding]:
    """Layers holding most of the saved activations: activation checkpointing candidates."""
    total = report.memory.saved_activation_bytes
    if not total or not any(m.saved_activation_bytes for m in report.modules):
        return
    share = resolve(ctx.options)["checkpoint_share"]
    groups = _block_groups(report, total, share)
    for parent, members in groups:
        held = sum(m.saved_activation_bytes for m in members)
        yield finding(
            "checkpoint-candidate",
            members[0].path,
            f"the {len(members)} {members[0].type} blocks in '{parent or '(root)'}' hold "
            f"{format_bytes(held)} ({held / total:.0%}) of the saved activations; "
            f"checkpointing each saves about {format_bytes(sum(map(_saving, members)))}.",
            "Wrap each block's call in torch.utils.checkpoint.checkpoint(block, x, "
            "use_reentrant=False).",
        )
    covered = [parent for parent, _ in groups]
    for module in _candidates(report, total, share):
        if any(p == module.path or p.startswith(module.path + ".") for p in covered):
            continue  # its repeated blocks were suggested above
        yield finding(
            "checkpoint-candidate",
            module.path,
            f"'{module.path}' ({module.type}) holds {format_bytes(module.saved_activation_bytes)}"
            f" ({module.saved_activation_bytes / total:.0%}) of the saved activations; "
            f"checkpointing it saves about {format_bytes(_saving(module))}.",
            "Wrap its call in torch.utils.checkpoint.checkpoint(module, x, use_reentrant=False).",
        )
