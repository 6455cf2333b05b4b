"""Progress that tells the truth: each stage starts at the share of the expected time
that the stages before it take.

The expected seconds come from the stage timings of recent reports (`meta.timings_s`,
learned by the worker: server/stagetimes.py) or, without any, from this table: one
default report of ResNet-18 at batch 8 on the 2-core development machine (issue #17),
where the passes that run the model for real dominate. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["DEFAULT_STAGE_SECONDS", "StagePlan"]

DEFAULT_STAGE_SECONDS: dict[str, float] = {
    "import": 1.5,  # a fresh job child's `import torch` and pipeline; ~0 when forked warm
    "load": 1.7,
    "capture": 2.6,
    "graph": 0.2,
    "memory": 8.6,
    "gradients": 8.1,
    "numerics": 9.8,
    "modes": 14.9,
    "export": 6.9,
    "serving": 0.5,
    "probe": 0.5,  # one instrumented forward and the loss
    "compile": 3.0,  # one Dynamo trace with an eager backend (issue #18's bench: ~5% of a run)
    "distributed": 0.0,  # only with --parallel plans: learned from reports that had them
    "fitplan": 0.0,  # only with --fit: learned from reports that had it
    "findings": 0.1,
}
MIN_STAGE_SECONDS = 0.01  # every stage that runs moves the bar a little


class StagePlan:
    """The stages that will run, in order, each with its start and end percent."""

    def __init__(self, stages: Iterable[str], seconds: Mapping[str, float] | None = None) -> None:
        expected = {**DEFAULT_STAGE_SECONDS, **_clean(seconds or {})}
        self.stages = list(stages)
        widths = [max(expected.get(s, 1.0), MIN_STAGE_SECONDS) for s in self.stages]
        total = sum(widths) or 1.0
        self.starts: dict[str, int] = {}
        done = 0.0
        for stage, width in zip(self.stages, widths, strict=True):
            self.starts.setdefault(stage, round(100 * done / total))
            done += width

    def percent(self, stage: str) -> int:
        """Where the bar stands when `stage` starts (100 for "done" or an unknown stage)."""
        return self.starts.get(stage, 100)


def _clean(seconds: Mapping[str, object]) -> dict[str, float]:
    """Numbers only, never negative: the learned values come from stored reports."""
    out: dict[str, float] = {}
    for key, value in seconds.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            out[str(key)] = float(value)
    return out
