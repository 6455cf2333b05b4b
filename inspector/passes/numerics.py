"""Numeric health: value statistics of every node's first floating output (`Node.stats`),
the first node producing NaN/Inf, dead ReLUs, saturated sigmoid/tanh, mixed-precision
hazards. One no-grad forward; the model's state is restored afterwards. Under a low
precision dtype, also the norm layers whose eps it loses (health/normeps.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from inspector.context import Context
from inspector.health.normeps import compute_dtype, lost_norm_eps
from inspector.health.outputs import flat_tensors
from inspector.health.state import preserved, seeded
from inspector.health.stats import tensor_stats
from inspector.health.thresholds import resolve
from inspector.health.values import NodeRef, run_nodes
from inspector.memory.allocations import ours
from inspector.report import NumericStats

__all__ = ["run", "runs_model", "NumericsResult", "FAKE_NOTE", "Observer"]

FAKE_NOTE = "numerics: not computed, fake tensors carry no values (run without --fake)"


@dataclass
class NumericsResult:
    computed: bool = False
    method: str = ""  # "graph" or "modules"
    stats: dict[str, NumericStats] = field(default_factory=dict)  # in forward order
    kinds: dict[str, str] = field(default_factory=dict)
    paths: dict[str, str | None] = field(default_factory=dict)
    first_nan_node: str | None = None
    error: str | None = None


def run(ctx: Context) -> None:
    result = NumericsResult()
    ctx.results.numerics = result
    if ctx.options.fake:
        result.error = FAKE_NOTE
        ctx.report.meta.warnings.append(FAKE_NOTE)
        return
    observed = ctx.results.numerics_observed
    if observed is not None and observed.computed:  # the gradients pass's replay saw it
        result = ctx.results.numerics = observed
    else:
        observer = Observer(ctx)
        try:
            with preserved(ctx.model), torch.no_grad():
                seeded(ctx.options.seed)
                _, result.method = run_nodes(ctx, observer.on_value, on_reset=observer.reset)
        except Exception as exc:  # noqa: BLE001 - the user's forward; reported, not raised
            result.error = f"numerics: forward failed: {type(exc).__name__}: {exc}"
            ctx.report.meta.warnings.append(result.error)
            return
        observer.result.method, observer.result.computed = result.method, True
        result = ctx.results.numerics = observer.result
    for node in ctx.report.nodes:
        node.stats = result.stats.get(node.name, node.stats)
    _check_norm_eps(ctx)


def runs_model(ctx: Context) -> bool:
    """Whether `run` will run the model: not where the gradients pass's forward gave the
    statistics and the run computes in float32 (the norm-eps check's forward is for low
    dtypes only)."""
    observed = ctx.results.numerics_observed
    return observed is None or not observed.computed or compute_dtype(ctx) is not None


def _check_norm_eps(ctx: Context) -> None:
    try:
        ctx.results.lost_norm_eps = lost_norm_eps(ctx)
    except Exception as exc:  # noqa: BLE001 - the user's forward under autocast
        note = "numerics: norm layers' eps not checked, the low-precision forward failed"
        ctx.report.meta.warnings.append(f"{note}: {type(exc).__name__}: {exc}")


class Observer:
    """The statistics of each node's first floating output, for `run_nodes`: the numerics
    pass's own forward, or the gradients pass's per-node replay (the same forward: seed,
    mode and inputs), which then spares numerics its run."""

    def __init__(self, ctx: Context) -> None:
        self.result = NumericsResult()
        self.min_samples = int(resolve(ctx.options)["dead_min_samples"])

    def on_value(self, ref: NodeRef, value: Any) -> None:
        # statistics, not part of the graph being differentiated, nor of a recorded step
        with torch.no_grad(), ours():
            _observe(self.result, ref, value, self.min_samples)

    def reset(self) -> None:
        _reset(self.result)


def _observe(result: NumericsResult, ref: NodeRef, value: Any, min_samples: int) -> None:
    tensor = next((t for _, t in flat_tensors(value) if t.is_floating_point()), None)
    if tensor is None or ref.name in result.stats:
        return
    stats = tensor_stats(tensor, ref.kind, min_samples)
    result.stats[ref.name] = stats
    result.kinds[ref.name], result.paths[ref.name] = ref.kind, ref.module_path
    if result.first_nan_node is None and (stats.nan_count or stats.inf_count):
        result.first_nan_node = ref.name


def _reset(result: NumericsResult) -> None:
    result.stats.clear()
    result.kinds.clear()
    result.paths.clear()
    result.first_nan_node = None
