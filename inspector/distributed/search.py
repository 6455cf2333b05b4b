"""The GPUs-needed search over one plan family: every rank run cached by plan and rank,
the search's lower bound (some kinds of rank) widened where the check finds another kind
heavier. Shared by the distributed pass and `bench/distributed.py --gpus`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from inspector.distributed.gpus import (
    LINE_SIZES,
    AtLeast,
    GpuCount,
    fewest_gpus_checked,
    fewest_tp,
)
from inspector.distributed.plan import rank_kinds, rank_memories, rank_memory
from inspector.distributed.rankmemory import RankMemory
from inspector.schema.parallel import PlanSpec

__all__ = ["PlanRuns", "gpus_needed"]

_BY_RANK = ("fsdp", "fsdp+tp", "tp")


class PlanRuns:
    """Each plan run once, each kind of rank of it once. `a` is the memory pass's
    analysis (its fake mode, inputs and step options; DDP also reads its step)."""

    def __init__(self, model: nn.Module, a: Any) -> None:
        self.model, self.a = model, a
        self.done: dict[str, RankMemory] = {}
        self.ranks: dict[tuple[str, int], RankMemory] = {}
        self.kinds: dict[str, set[int]] = {}  # a family's kinds of rank in its lower bound
        self.heavy: dict[str, int] = {}  # the position of the kind heaviest there last

    def __call__(self, spec: PlanSpec) -> RankMemory:
        """The heaviest rank of `spec`."""
        if spec.text not in self.done:
            if spec.strategy in _BY_RANK:
                kinds = self._ranks(spec, rank_kinds(spec, self.model))
                self.done[spec.text] = max(kinds, key=lambda m: m.peak_bytes)
            else:
                self.done[spec.text] = rank_memory(spec, self.model, self.a)
        return self.done[spec.text]

    def lower_bound(self, spec: PlanSpec, over: int | None = None) -> tuple[RankMemory, bool]:
        """The heaviest of some kinds of rank of `spec`, never above `self(spec)`: the
        first and the last kind (full chunks; the short ones) and those `widen` added;
        and whether all of them were run. With `over`, they are run heaviest-last-time
        first and the first one over `over` ends it: that is all a search asks there."""
        kinds = rank_kinds(spec, self.model)
        if len(kinds) == 1:
            return self(spec), True
        positions = {p % len(kinds) for p in self.kinds.get(spec.family, {0, -1})}
        heavy = self.heavy.get(spec.family, -1) % len(kinds)
        ranks = sorted((kinds[p] for p in positions), key=lambda r: r != kinds[heavy])
        found: list[RankMemory] = []
        for rank in ranks:
            found += self._ranks(spec, [rank])
            if over is not None and found[-1].peak_bytes > over and len(found) < len(ranks):
                self.heavy[spec.family] = _position(kinds, rank)
                return found[-1], False
        heaviest = max(found, key=lambda m: m.peak_bytes)
        self.heavy[spec.family] = _position(kinds, heaviest.rank)
        return heaviest, True

    def widen(self, spec: PlanSpec) -> bool:
        """Add the position of the kind heaviest under `spec` to its family's lower bound;
        False when it is there already."""
        kinds = rank_kinds(spec, self.model)
        heaviest = kinds.index(self(spec).rank) if self(spec).rank in kinds else 0
        chosen = self.kinds.setdefault(spec.family, {0, -1})
        if heaviest in {p % len(kinds) for p in chosen}:
            return False
        chosen.add(heaviest)
        return True

    def _ranks(self, spec: PlanSpec, ranks: list[int]) -> list[RankMemory]:
        missing = [r for r in ranks if (spec.text, r) not in self.ranks]
        if missing:
            got = rank_memories(spec, self.model, self.a, missing)
            self.ranks.update({(spec.text, r): m for r, m in got.items()})
        return [self.ranks[spec.text, r] for r in ranks]


def _position(kinds: list[int], rank: int) -> int:
    """`rank`'s place among `kinds`, counted from the nearer end (the last kind is -1 at
    every world size, however many kinds it has)."""
    i = kinds.index(rank) if rank in kinds else len(kinds) - 1
    return i if i < len(kinds) // 2 else i - len(kinds)


def gpus_needed(runs: PlanRuns, spec: PlanSpec, budgets: list[int]) -> list[GpuCount]:
    """The fewest GPUs of `spec`'s family under each budget, each verified by its runs
    (`gpus` counts every GPU: a 2-D plan keeps its TP degree and varies its FSDP one)."""
    group = spec.tp_size if spec.strategy == "fsdp+tp" else 1

    def peak_at(n: int) -> int:
        return runs(spec.with_world_size(n * group)).peak_bytes

    def lower_bound_at(n: int, over: int | None = None) -> int:
        m, whole = runs.lower_bound(spec.with_world_size(n * group), over)
        return m.peak_bytes if whole else AtLeast(m.peak_bytes)

    def widen(n: int) -> bool:
        return runs.widen(spec.with_world_size(n * group))

    if spec.strategy == "tp":
        counts = fewest_tp(peak_at, budgets)
    else:  # through the asked degree (already run) and 8 times it
        dp = spec.world_size // group
        line = (dp, 8 * dp) if dp > 1 else LINE_SIZES
        sharded = spec.strategy != "ddp"
        counts = fewest_gpus_checked(
            lower_bound_at, peak_at, budgets, sharded, line, widen, stops_over=True
        )
    return [
        GpuCount(c.budget_bytes, c.gpus * group if c.gpus else None, c.per_rank_peak_bytes)
        for c in counts
    ]
