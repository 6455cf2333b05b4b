"""A deep stack of identical blocks, run short and scaled: a rank's figures at L blocks
from runs at two short depths.

A transformer's decoder layers are identical (the same modules, parameter shapes and
dtypes): under FSDP, TP or both, each one adds the same sharded parameters, gradients and
optimizer state, the same saved activations, and its place in the step repeats, so a
rank's peak at depth L lies on the line through the peaks at depths a and b, as long as
the peak happens at the same place (its phase and module kind) at both. The run at each
depth is the real one (torch's own `fully_shard` / `parallelize_module` on fake tensors),
with the model's block list cut to its first blocks for the run; embeddings, final norm
and head stay. `tests/test_distributed_scale.py` checks the line against a full run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields, replace

from torch import nn

from inspector.distributed.fsdp import shard_units
from inspector.distributed.rankmemory import RankMemory
from inspector.forkmap import fork_map

__all__ = ["identical_blocks", "cut_to", "scaled", "SHORT_DEPTHS", "SCALE_FROM"]

SHORT_DEPTHS = (3, 4)  # past the first and last block's edge effects (prefetch, root)
SCALE_FROM = 8  # fewer identical blocks: run them all
_LINEAR = ("peak_bytes", "param_bytes", "grad_bytes", "optimizer_bytes",
           "saved_activation_bytes", "host_bytes")  # fmt: skip


def identical_blocks(model: nn.Module) -> tuple[str, int] | None:
    """(path of the container, count) when the model's blocks are all the members of one
    ModuleList or Sequential and identical in type, parameter names, shapes and dtypes."""
    paths = shard_units(model)
    parents = {p.rpartition(".")[0] for p in paths}
    if len(paths) < 2 or len(parents) != 1:
        return None
    parent = parents.pop()
    container = model.get_submodule(parent) if parent else model
    if not isinstance(container, nn.ModuleList | nn.Sequential) or len(container) != len(paths):
        return None
    first = _signature(container[0])
    if any(_signature(block) != first for block in container):
        return None
    return parent, len(container)


def _signature(block: nn.Module) -> tuple:
    params = tuple((n, tuple(p.shape), p.dtype) for n, p in block.named_parameters())
    types = tuple(type(m).__name__ for m in block.modules())
    return params, types


@contextmanager
def cut_to(model: nn.Module, parent: str, depth: int) -> Iterator[None]:
    """The ModuleList at `parent` holds its first `depth` blocks while this lasts."""
    container = model.get_submodule(parent) if parent else model
    saved = dict(container._modules)
    container._modules = {k: v for i, (k, v) in enumerate(saved.items()) if i < depth}
    try:
        yield
    finally:
        container._modules = saved


def scaled(
    run: Callable[[nn.Module], RankMemory],
    model: nn.Module,
    depths: tuple[int, int] = SHORT_DEPTHS,
) -> RankMemory | None:
    """`run(model)` at the model's full depth from runs at `depths`; None when the model
    is not a deep stack of identical blocks or the peak moves between the short runs."""
    found = identical_blocks(model)
    if found is None or found[1] < SCALE_FROM:
        return None
    parent, depth = found
    a, b = depths

    def at(k: int) -> RankMemory:
        with cut_to(model, parent, k):
            return run(model)

    short, longer = fork_map(at, [a, b])  # the two depths side by side

    def line(low: int, high: int) -> int:
        return low + (depth - a) * (high - low) // (b - a)

    peak = _deepest_peak(short, longer, line)
    if peak is None:
        return None
    key, peak_bytes, grows = peak
    values = {
        f.name: line(getattr(short, f.name), getattr(longer, f.name))
        for f in fields(RankMemory)
        if f.name in _LINEAR
    }
    note = (
        f"scaled to {depth} identical blocks ({parent}) from runs with the first {a} "
        f"and {b}: each block adds {_gb(grows // (b - a))} to the peak"
    )
    values["peak_bytes"] = peak_bytes
    out = replace(longer, **values, notes=[*longer.notes, note])
    out.peak_phase = key.partition("|")[0]
    out.units = longer.units + (depth - b) * (longer.units - short.units) // (b - a)
    labels = short.kind_peaks[key][1], longer.kind_peaks[key][1]
    out.peak_label = _at_depth(*labels, parent, (a, b), depth)
    return out


def _deepest_peak(
    short: RankMemory, longer: RankMemory, line: Callable[[int, int], int]
) -> tuple[str, int, int] | None:
    """(kind, bytes at full depth, growth from a to b) of the highest place at full depth.
    Each place in the step (its phase and where in a block, block index left out) is
    linear in the depth, but they grow at different rates: where the peak is at the short
    depths (the embedding's gradient at the end of backward) need not be where it is at
    full depth (the first block's backward, with every block's activations saved), so
    every place is scaled and the highest kept. Places seen at one depth only: None."""
    kinds = short.kind_peaks.keys() & longer.kind_peaks.keys()
    if not kinds or kinds != short.kind_peaks.keys() | longer.kind_peaks.keys():
        return None
    scaled_at = {k: line(short.kind_peaks[k][0], longer.kind_peaks[k][0]) for k in kinds}
    key = max(sorted(scaled_at), key=scaled_at.__getitem__)
    return key, scaled_at[key], longer.kind_peaks[key][0] - short.kind_peaks[key][0]


def _at_depth(
    short: str | None, label: str | None, parent: str, depths: tuple[int, int], depth: int
) -> str | None:
    """The label at depth b renamed to full depth: a peak whose block moved with the depth
    (the last block, or the one before it under CPU offload) keeps its distance from the
    end; one that stayed (block 1) keeps its index."""
    (a, b), head = depths, re.escape(f"{parent}." if parent else "")
    found = [re.match(rf"{head}(\d+)(\.|$)", x or "") for x in (short, label)]
    if not (found[0] and found[1]):
        return label
    at_a, at_b = (int(m.group(1)) for m in found)
    if at_b - at_a != b - a:
        return label
    end = found[1].end(1)
    return f"{label[: found[1].start(1)]}{depth - (b - at_b)}{label[end:]}"


def _gb(n: int) -> str:
    from inspector.units import format_bytes

    return format_bytes(n)
