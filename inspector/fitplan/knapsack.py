"""Which blocks to checkpoint: a knapsack of saved bytes freed against recompute FLOPs.

Each block frees the bytes its own ops saved and costs one more forward of it in
backward. The cheapest set that frees at least `need` bytes is found by dynamic
programming over the need cut into `STEPS` parts; each block's saving is rounded down to
whole parts, so the set chosen frees at least `need` by its unrounded savings too.
"""

from __future__ import annotations

import math

__all__ = ["cheapest_cover", "STEPS"]

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
