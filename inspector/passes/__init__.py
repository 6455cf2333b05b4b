"""The analyses, in order. A pass is `run(ctx: Context) -> None` that fills its sections
of `ctx.report` (and may annotate `ctx.report.nodes` / `modules`). A new analysis is a
new module plus one line here."""

from __future__ import annotations

from collections.abc import Callable

from inspector.beside import Beside
from inspector.context import Context, Options
from inspector.passes import (
    distributed,
    dynamo,
    export,
    findings,
    fitplan,
    gradients,
    graph,
    measure,
    memory,
    modes,
    numerics,
    probe,
    serving,
)

Pass = Callable[[Context], None]

PASSES: list[tuple[str, Pass]] = [
    ("graph", graph.run),  # shapes, parameters, FLOPs -> nodes, modules, totals
    ("memory", memory.run),  # static memory, saved activations, peaks, batch scaling
    ("distributed", distributed.run),  # --parallel: per-rank memory, fewest GPUs that fit
    ("fitplan", fitplan.run),  # --fit BUDGET: the cheapest verified changes that fit
    ("gradients", gradients.run),  # one forward + backward: gradient flow per param/layer/node
    ("numerics", numerics.run),  # Node.stats: ranges, NaN/Inf, dead ReLU, fp16/bf16 hazards
    ("modes", modes.run),  # train() vs eval(): mode-dependent modules, divergence, BatchNorm
    ("export", export.run),  # torch.export / TorchScript / ONNX readiness
    ("serving", serving.run),  # KV cache per token, prefill/decode peaks, sequences that fit
    ("measure", measure.run),  # the memory estimate's real step, measured (with memory)
    ("probe", probe.run),  # loss inputs (softmax before CE...), parameters made in forward
    ("compile", dynamo.run),  # torch.compile readiness: Dynamo graphs, breaks, recompiles
    ("findings", findings.run),  # lint rules over every section: keep LAST
]

# Passes asked for with another: `--passes memory` measures the estimate too.
ASKED_WITH = {"measure": "memory"}


def wanted(name: str, options: Options) -> bool:
    """Whether the options ask for pass `name`."""
    return options.wants(ASKED_WITH.get(name, name))


# Passes that can run beside the others (inspector/beside.py): they start once the graph
# is known (everything they read is there; bounds from its nodes size them), else once the
# memory pass is done (its estimate sizes them), and are put in the report in their place.
# In the order a lane runs them, the dearest first as a rule: Dynamo's trace of the
# training forward, torch.export and its checks, a forward, what a measured step adds to
# the gradients pass's (CPU seconds: fcn_resnet50 1.16, 0.59, 0.13, 0.12; a 1,000-layer
# stack 2.8, 2.0, 0.03, 0.7; ResNet-18 at [8, 3, 224, 224] 0.58, 0.76, 0.06, 0.06).
BESIDE: dict[str, Beside] = {
    "compile": Beside("memory", dynamo.compute, dynamo.apply, dynamo.needs, "graph"),
    "export": Beside("memory", export.compute, export.apply, export.needs, "graph"),
    "probe": Beside("memory", probe.compute, probe.apply, probe.needs, "graph"),
    "measure": Beside("memory", measure.compute, measure.apply, measure.needs, "graph"),
}

# Passes that need values: on fake tensors they only say they were skipped.
_VALUE_PASSES = frozenset({"gradients", "numerics", "modes", "export"})


def runs_model(name: str, ctx: Context) -> bool | Callable[[Context], bool]:
    """Whether pass `name` will run torch on the model here, and so could crash the
    process natively; the others run without a fork (inspector/isolation.py). For the
    passes the gradients pass may have run already (its forward recorded theirs), what
    answers once the passes before have run: a fork costs the line 16-39 ms each."""
    if name == "findings":  # rules over the report: Python only
        return False
    if name in _VALUE_PASSES and ctx.options.fake:
        return False
    if name == "serving":
        return serving.wanted(ctx)
    if name == "distributed":
        return bool(ctx.options.parallel)
    if name == "fitplan":
        return fitplan.wanted(ctx)
    if name == "measure":
        return measure.wanted(ctx)
    if name == "numerics":
        return numerics.runs_model
    if name == "modes":
        return modes.runs_model
    return True
