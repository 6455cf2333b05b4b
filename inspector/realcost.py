"""Is a real run of this model dearer than a fake one? From what the report timed: the
memory pass's fake rerun (before that pass, the graph pass's runs on meta tensors), and
the real forward the inputs-fit check ran at load.

Real runs cost their arithmetic, fake runs their Python: a 1,000-layer MLP of width 32
steps in 1.0 s fake against 0.05 s real; ResNet-18 at batch 8 the other way round
(0.07 s fake, 0.6 s real). Where real runs are the dearer, Dynamo's check runs on a
fake copy, so does the probe's forward, and the passes beside the others share one lane
per spare core (real arithmetic contends for the memory; inspector/beside.py).
"""

from __future__ import annotations

from typing import Any

__all__ = ["fake_step_is_cheaper", "real_runs_dear_by_graph", "REAL_STEP_FORWARDS"]

REAL_STEP_FORWARDS = 3  # a training step: the forward, and a backward of about two


def fake_step_is_cheaper(ctx: Any) -> bool:
    """Whether a fake training step (the memory pass's rerun, timed) costs less than a
    real one, taken as three of the real forwards the inputs-fit check timed at load.
    Not the measured real step: that one may run beside the passes that ask.

    Before the memory pass has run (or where it could not), a fake step is taken as three
    times the graph pass, whose runs on meta tensors (a recording hook per node, a run
    per named dim) cost a third of a fake step to about a whole one: ResNet-18 at batch
    8, the graph pass 0.06 s, a fake step 0.07 s, a real forward 0.3 s; a 1,000-layer
    stack, 0.29 s, 1.0 s and 0.04 s."""
    forward, estimated = ctx.results.real_forward_seconds, ctx.results.memory
    if forward is None:
        return False
    if estimated is not None:
        return estimated.on_fake and estimated.rerun_cost < REAL_STEP_FORWARDS * forward
    return real_runs_dear_by_graph(ctx)


def real_runs_dear_by_graph(ctx: Any) -> bool:
    """The judgement before the memory pass: three graph passes against three of the
    load's real forwards. Fixed once the graph pass is done, so every process of a run
    that asks later gets the same answer (inspector/memory/merged.py)."""
    forward = ctx.results.real_forward_seconds
    graph = ctx.report.meta.timings_s.get("graph")
    return forward is not None and graph is not None and graph < forward
