"""Advice: which layers to checkpoint, and what bf16 autocast would save.

Checkpointing a block keeps only its inputs and recomputes the rest in backward, so it
frees what the block's own ops saved, except the block's output (the next layer still
saves that). Blocks follow the model's own structure (`blocks`): the members of a
container of composite modules (transformer layers, ResNet stages' blocks, MobileNet's
`features`), a chain of single layers as one block (a UNet's conv-BN-ReLU Sequentials),
and same-type composite siblings (timm stages). `inspector.memory.checkpointing` then
runs the advised checkpointing on fake tensors and the advice quotes what it measured;
where a block cannot free `MEANINGFUL_SHARE` of the peak at most (`checkpoint_bound`), its
advice could not be shown, and no run is made.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from inspector.memory.namedblocks import current_patterns, match_blocks
from inspector.report import MemoryAdvice
from inspector.units import format_bytes

__all__ = [
    "blocks",
    "block_savings",
    "checkpoint_bound",
    "subtree_bytes",
    "Checked",
    "checkpoint_advice",
    "autocast_advice",
    "MEANINGFUL_SHARE",
    "meaningful_bytes",
]

TOP = 5
MEANINGFUL_SHARE = 0.01  # advice that saves less of the training-step peak is noise


def _container(module: nn.Module) -> bool:
    return isinstance(module, nn.ModuleList | nn.Sequential)


def _composite(module: nn.Module) -> bool:
    return next(module.children(), None) is not None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _visit(path: str, module: nn.Module, out: list[tuple[str, str]]) -> None:
    composite = [(_join(path, n), c) for n, c in module.named_children() if _composite(c)]
    if _container(module):
        if not composite:  # a chain of single layers (conv, norm, activation): one block
            if path:
                out.append((path, type(module).__name__))
            return
        for child_path, child in composite:  # its members are the blocks
            if _container(child):
                _visit(child_path, child, out)
            else:
                out.append((child_path, type(child).__name__))
        return
    counts: dict[type, int] = defaultdict(int)
    for _, child in composite:
        counts[type(child)] += 1
    for child_path, child in composite:
        repeated = counts[type(child)] >= 2 and not _container(child)
        if repeated:
            out.append((child_path, type(child).__name__))  # same-type siblings: blocks
        else:
            _visit(child_path, child, out)


def blocks(model: nn.Module) -> list[tuple[str, str]]:
    """(path, type) of the checkpointable blocks, in model order: the ones the user named
    with `--blocks` (inspector.memory.namedblocks), else the model's own."""
    if patterns := current_patterns():
        return match_blocks(model, patterns)
    out: list[tuple[str, str]] = []
    _visit("", model, out)
    return out or [(n, type(m).__name__) for n, m in model.named_children()]


def unsaved_block_inputs(model: nn.Module, train: Any) -> int:
    """Bytes of block inputs that no op saved: a checkpointed block keeps its input, so
    these come on top of what is saved now. A block's input is the previous block's output
    (the first block's input is not known here: left out)."""
    saved = train.saved  # storage key -> (bytes, producer)
    total = 0
    paths = [path for path, _ in blocks(model)]
    for path in paths[:-1]:  # the last block's output is no block's input
        keys = train.module_outputs.get(path, set())
        if keys and not any(k in saved for k in keys):
            total += train.module_output_bytes.get(path, 0)
    return total


def _inside(label: str | None, path: str) -> bool:
    return label is not None and (label == path or label.startswith(path + "."))


def subtree_bytes(by_label: dict[str | None, int]) -> dict[str, int]:
    """Bytes per module path, each module counting its whole subtree ("" = the model)."""
    out: dict[str, int] = defaultdict(int)
    for label, nbytes in by_label.items():
        if label is None or label.startswith("("):
            continue
        parts = label.split(".") if label else []
        for i in range(len(parts) + 1):
            out[".".join(parts[:i])] += nbytes
    return dict(out)


def block_savings(
    model: nn.Module, saved: dict[int, tuple[int, str | None]], outputs: dict[str, set[int]]
) -> list[tuple[int, str, str]]:
    """(predicted saving, path, type) of every block whose checkpointing frees saved bytes,
    the largest first: what the block's own ops saved, less its output (still saved by
    the next layer)."""
    savings = []
    for path, kind in blocks(model):
        own = sum(n for k, (n, who) in saved.items() if _inside(who, path))
        kept = sum(
            n for k, (n, who) in saved.items() if k in outputs.get(path, ()) and _inside(who, path)
        )
        if own - kept > 0:
            savings.append((own - kept, path, kind))
    return sorted(savings, reverse=True)


def meaningful_bytes(peak_bytes: int) -> int:
    """The least saving advice quotes: `MEANINGFUL_SHARE` of the training-step peak."""
    return int(MEANINGFUL_SHARE * peak_bytes)


def checkpoint_bound(train: Any, paths: Sequence[str]) -> int:
    """The most saved bytes checkpointing the blocks at `paths` can free: the storages
    that only ops running inside them saved (under a block's call, whatever module they
    belong to). Any other saved storage an op outside the blocks saves again with them
    checkpointed, and a checkpoint only adds what it keeps; so the run's measured saving
    is at most this."""
    blocks = frozenset(paths)
    inside = (tuple(blocks),)  # a storage without its savers noted counts as theirs
    return sum(
        nbytes
        for key, (nbytes, _) in train.saved.items()
        if all(not blocks.isdisjoint(stack) for stack in train.savers.get(key, inside))
    )


@dataclass(frozen=True)
class Checked:
    """A checkpointing measured on fake tensors: the step's saved bytes and peak after it."""

    saving_bytes: int
    saved_bytes: int
    fb_peak_bytes: int  # the forward/backward peak (the set-ups table's figure)
    peak_bytes: int
    on: str  # the block it ran on (blocks like it share the result)


def checkpoint_advice(
    savings: list[tuple[int, str, str]],
    checked: dict[str, Checked],
    every: Checked | None,
    min_bytes: int,
) -> list[MemoryAdvice]:
    """The blocks whose checkpointing frees the most (top few), and all of them. The figure
    quoted is the measured one where the run was made (`checked`, `every`), else the
    prediction; advice under `min_bytes` is left out."""
    advice = []
    for predicted, path, kind in savings[:TOP]:
        check = checked.get(path)
        saving = check.saving_bytes if check else predicted
        if saving < min_bytes:
            continue
        how = _checked_text(check, path) if check else "predicted from the saved tensors"
        advice.append(
            MemoryAdvice(
                kind="checkpoint", where=path, saving_bytes=saving,
                predicted_saving_bytes=predicted, verified=check is not None,
                train_peak_bytes=check.peak_bytes if check else None,
                message=f"Checkpointing {path} ({kind}) frees {format_bytes(saving)} of saved "
                f"activations ({how}), for one extra forward of it in backward.",
            )
        )  # fmt: skip
    total = every.saving_bytes if every else sum(s for s, _, _ in savings)
    if len(savings) > 1 and total >= min_bytes:
        how = _checked_text(every, None) if every else "predicted from the saved tensors"
        advice.append(
            MemoryAdvice(
                kind="checkpoint-all", where=None, saving_bytes=total,
                predicted_saving_bytes=sum(s for s, _, _ in savings), verified=every is not None,
                train_peak_bytes=every.peak_bytes if every else None,
                message=f"Checkpointing all {len(savings)} blocks frees {format_bytes(total)} "
                f"of saved activations ({how}).",
            )
        )  # fmt: skip
    return advice


def _checked_text(check: Checked, path: str | None) -> str:
    like = f" on {check.on}, a block like it" if path is not None and check.on != path else ""
    return (
        f"measured on fake tensors{like}: the step then saves {format_bytes(check.saved_bytes)}"
        f" and peaks at {format_bytes(check.peak_bytes)}"
    )


def autocast_advice(peak: int, saved: int, bf16_peak: int, bf16_saved: int) -> MemoryAdvice:
    return MemoryAdvice(
        kind="autocast-bf16",
        where=None,
        saving_bytes=peak - bf16_peak,
        verified=True,
        train_peak_bytes=bf16_peak,
        message=f"bf16 autocast would take the training-step peak from {format_bytes(peak)} to "
        f"{format_bytes(bf16_peak)} and saved activations from {format_bytes(saved)} to "
        f"{format_bytes(bf16_saved)} (measured on fake tensors, weights kept in float32).",
    )
