"""Progress that tells the truth: each stage starts at the share of the expected time
that the stages before it take.

The expected seconds come from the stage timings of recent reports (`meta.timings_s`,
learned by the worker: server/stagetimes.py) or, without any, from this table: one
default report of ResNet-18 at batch 8 on the 2-core development machine (issue #17,
`bench/pipeline.py --only resnet18` at stop 30), where the passes that run the model for
real dominate. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["DEFAULT_STAGE_SECONDS", "StagePlan"]

DEFAULT_STAGE_SECONDS: dict[str, float] = {
    "import": 1.5,  # a fresh job child's `import torch` and pipeline; ~0 when forked warm
    "load": 0.5,
    "capture": 0.5,
    "graph": 0.2,
    "memory": 3.4,  # the estimate's fake steps
    "measure": 0.3,  # its real step, measured: mostly beside the passes after memory
    "gradients": 3.0,  # its replay is numerics' forward too
    "numerics": 0.1,  # its own forward only where the gradients' replay could not serve
    "modes": 1.2,
    "export": 1.6,  # non-strict torch.export; `--export all` learns its own from reports
    "serving": 0.5,
    "probe": 0.2,  # one instrumented forward and the loss (on a fake copy where cheaper)
    "compile": 1.9,  # one Dynamo trace with an eager backend
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
