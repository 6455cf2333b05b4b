"""The search's runs: each candidate run on fake tensors and recorded as a try, and the
loop that runs candidates cheapest first until one fits."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from inspector.context import Context
from inspector.fitplan.candidate import Candidate
from inspector.fitplan.pieces import Pieces
from inspector.fitplan.predict import predict_peak
from inspector.fitplan.verify import Verified, verify, verify_sharded
from inspector.memory.analysis import Analysis

__all__ = ["Search", "first_fit", "divisors"]


@dataclass
class Search:
    ctx: Context
    a: Analysis
    p: Pieces
    budget: int
    batch: int | None  # effective batch
    tries: list[tuple[Candidate, int | None, Verified | None]] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)  # try index -> why its run failed
    sharded_predicted: int | None = None  # the sharded plan's predicted peak

    def run(self, c: Candidate, predicted: int | None = None) -> Verified | None:
        """Run `c` on fake tensors and record the try (None: the run failed); `predicted`:
        its peak as the search predicted it (one GPU: `predict_peak`)."""
        if predicted is None and c.gpus == 1:
            predicted = predict_peak(self.p, c)
        try:
            v = verify_sharded(self.ctx, self.a, c) if c.gpus > 1 else verify(self.ctx, self.a, c)
        except Exception as exc:  # a failed run is no fit; the search goes on
            self.errors[len(self.tries)] = f"{type(exc).__name__}: {first_line(exc)}"
            v = None
        self.tries.append((c, predicted, v))
        return v


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def divisors(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def first_fit(
    s: Search,
    found: list[Candidate],
    predict: Callable[[Candidate], int],
    cover: Callable[[Candidate, int], Candidate | None],
    runs: int,
) -> tuple[Candidate, Verified] | None:
    """Run `found` cheapest first, at most `runs` runs, until one fits. A run over the
    budget is queued once more with `cover(it with no checkpointing, its shortfall)`: the
    checkpointing chosen again for what the prediction missed."""
    queue = [(c.cost(), i, c) for i, c in enumerate(found)]
    heapq.heapify(queue)
    retried: set[Candidate] = set()
    order = len(queue)
    while queue and runs > 0:
        _, _, c = heapq.heappop(queue)
        predicted = predict(c)
        v, runs = s.run(c, predicted), runs - 1
        if v is None:
            continue
        if v.peak_bytes <= s.budget:
            return c, v
        if c in retried:
            continue
        again = cover(replace(c, checkpoint=(), extra_compute=0.0), v.peak_bytes - predicted)
        if again is not None and again.checkpoint != c.checkpoint:
            retried.add(again)
            order += 1
            heapq.heappush(queue, (again.cost(), order, again))
    return None
