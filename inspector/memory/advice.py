"""Advice: which layers to checkpoint, and what bf16 autocast would save.

Checkpointing a block keeps only its inputs and recomputes the rest in backward, so it
frees what the block's own ops saved, except the block's output (the next layer still
saves that). Blocks are the children of `nn.ModuleList` / `nn.Sequential` containers
(transformer layers, ResNet stages' blocks), else the model's direct children.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torch import nn

from inspector.report import MemoryAdvice
from inspector.units import format_bytes

__all__ = ["blocks", "subtree_bytes", "checkpoint_advice", "autocast_advice"]

TOP = 5


def blocks(model: nn.Module) -> list[tuple[str, str]]:
    """(path, type) of the checkpointable blocks, in model order."""
    out: list[tuple[str, str]] = []
    for path, module in model.named_modules():
        if isinstance(module, nn.ModuleList | nn.Sequential) and path:
            out += [(f"{path}.{n}", type(m).__name__) for n, m in module.named_children()]
    if not out:
        out = [(n, type(m).__name__) for n, m in model.named_children()]
    return [b for b in out if not any(b[0].startswith(o[0] + ".") for o in out if o != b)]


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


def checkpoint_advice(
    model: nn.Module, saved: dict[int, tuple[int, str | None]], outputs: dict[str, set[int]]
) -> list[MemoryAdvice]:
    """The blocks whose checkpointing frees the most saved bytes (top few, and all of them)."""
    savings = []
    for path, kind in blocks(model):
        own = sum(n for k, (n, who) in saved.items() if _inside(who, path))
        kept = sum(
            n for k, (n, who) in saved.items() if k in outputs.get(path, ()) and _inside(who, path)
        )
        if own - kept > 0:
            savings.append((own - kept, path, kind))
    savings.sort(reverse=True)
    advice = [
        MemoryAdvice(
            kind="checkpoint",
            where=path,
            saving_bytes=saving,
            message=f"Checkpointing {path} ({kind}) would free about {format_bytes(saving)} "
            "of saved activations, for one extra forward of it in backward.",
        )
        for saving, path, kind in savings[:TOP]
    ]
    if len(savings) > 1:
        total = sum(s for s, _, _ in savings)
        advice.append(
            MemoryAdvice(
                kind="checkpoint-all",
                where=None,
                saving_bytes=total,
                message=f"Checkpointing all {len(savings)} blocks would free about "
                f"{format_bytes(total)} of saved activations (about one block's worth comes "
                "back while it is recomputed).",
            )
        )
    return advice


def autocast_advice(peak: int, saved: int, bf16_peak: int, bf16_saved: int) -> MemoryAdvice:
    return MemoryAdvice(
        kind="autocast-bf16",
        where=None,
        saving_bytes=peak - bf16_peak,
        message=f"bf16 autocast would take the training-step peak from {format_bytes(peak)} to "
        f"{format_bytes(bf16_peak)} and saved activations from {format_bytes(saved)} to "
        f"{format_bytes(bf16_saved)} (measured on fake tensors, weights kept in float32).",
    )
