"""Which blocks to checkpoint: a knapsack of saved bytes freed against recompute FLOPs.

Each block frees the bytes its own ops saved and costs one more forward of it in
backward. The cheapest set that frees at least `need` bytes is found by dynamic
programming over the need cut into `STEPS` parts; each block's saving is rounded down to
whole parts, so the set chosen frees at least `need` by its unrounded savings too.
`cover` and `with_checkpoint` put a candidate's shortfall, by the prediction, to it.
"""

from __future__ import annotations

import math
from dataclasses import replace

from inspector.fitplan.candidate import Candidate
from inspector.fitplan.pieces import Pieces
from inspector.fitplan.predict import (
    activation_scale,
    fb_without_checkpoint,
    optimizer_peak,
    selective_share,
)

__all__ = ["cheapest_cover", "STEPS", "checkpointing", "cover", "with_checkpoint"]

STEPS = 256


def cheapest_cover(items: list[tuple[int, int]], need: int) -> list[int] | None:
    """`items`: (bytes freed, FLOPs) per block. The indices of the set freeing >= `need`
    at the fewest FLOPs (ties: fewer blocks), [] when nothing is needed, None when even
    every block frees too little."""
    if need <= 0:
        return []
    if sum(s for s, _ in items) < need:
        return None
    unit = need / STEPS
    # best[c]: (FLOPs, blocks, chosen) reaching at least c units; c capped at STEPS
    best: list[tuple[float, int, tuple[int, ...]] | None] = [None] * (STEPS + 1)
    best[0] = (0, 0, ())
    for i, (saving, flops) in enumerate(items):
        units = math.floor(saving / unit)
        if units <= 0:
            continue
        for c in range(STEPS, -1, -1):  # each block once: go down
            if best[c] is None:
                continue
            cost, count, chosen = best[c]  # type: ignore[misc]
            to = min(STEPS, c + units)
            option = (cost + flops, count + 1, (*chosen, i))
            if best[to] is None or option[:2] < best[to][:2]:  # type: ignore[index]
                best[to] = option
    if best[STEPS] is None:  # rounding down lost too much: take every block, largest first
        return sorted(range(len(items)), key=lambda i: -items[i][0])
    return sorted(best[STEPS][2])


def with_checkpoint(p: Pieces, c: Candidate, budget: int, extra: int = 0) -> Candidate | None:
    """`c` with the cheapest blocks to checkpoint for its predicted peak to fit (`extra`:
    bytes more to free, a run's shortfall); None when no checkpointing can."""
    if optimizer_peak(p, c) > budget:
        return None
    return cover(p, c, fb_without_checkpoint(p, c) + extra - budget)


def cover(p: Pieces, c: Candidate, need: float) -> Candidate | None:
    """`c` with the cheapest blocks to checkpoint that take `need` bytes off its peak."""
    share = selective_share(p, c) if c.selective else 0.0
    if c.selective:  # every block selective first; a block fully checkpointed loses it
        need -= share * len(p.block_paths)
    if need <= 0:
        return c
    scale = activation_scale(p, c)
    items = [(max(0, round(b.saving_bytes * scale - share)), b.flops) for b in p.blocks]
    if not items:
        return None
    # the largest block's activations come back while it is recomputed
    largest = max(b.saving_bytes for b in p.blocks) * scale
    chosen = cheapest_cover(items, round(need + largest))
    if chosen is None:
        return None
    return checkpointing(p, c, {p.blocks[i].path for i in chosen})


def checkpointing(p: Pieces, c: Candidate, paths: set[str]) -> Candidate:
    """`c` with the blocks at `paths` checkpointed (in model order) and the predicted
    extra compute: their forward FLOPs over the step's forward + backward FLOPs."""
    chosen = [b for b in p.blocks if b.path in paths]
    flops = sum(b.flops for b in chosen)
    extra = flops / p.step_flops if p.step_flops else 0.0
    return replace(c, checkpoint=tuple(b.path for b in chosen), extra_compute=extra)
