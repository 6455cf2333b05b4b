"""The memory pass's runs that need only the analysis, planned at once and run side by
side (inspector/forkmap.py `side_by_side`).

After the first training step and inference forward, the pass makes several more runs
on fake tensors that share nothing: the per-node forward on the captured graph, the step
at twice the batch, the advised checkpointing, the bf16 step, the optimizers' steps. The
runs slow enough to be worth a fork are queued for a forked worker per spare core, and
this process takes from the same queue once it has run the others. Each run is a pure
function of the analysis: in a child or here, the same figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from inspector import forkmap
from inspector.context import Context, Inputs
from inspector.fakevalues import new_fake_mode
from inspector.forkmap import Outcome, side_by_side
from inspector.graph.exportcapture import WRAPPED, flat_tensors
from inspector.graph.fxcapture import FLAT_INPUTS
from inspector.memory import advice, setups
from inspector.memory.analysis import Analysis, batch_runs, fb_peak, rerun
from inspector.memory.checkpointing import run_checkpointed
from inspector.memory.nodes import NodeMemory, node_memory
from inspector.memory.shadow import fake_shadow
from inspector.memory.step import TrainResult, unique_tensors
from inspector.results import AutocastStep

__all__ = [
    "Runs", "run_independent", "checkpoint_runs", "checkpoint_groups", "checkpoint_key",
    "graph_inputs", "analysed_step_cost",
]  # fmt: skip

# A warm rerun of the fake step costs about half the first one, which paid the
# process's first fake dispatches (UNet 0.04-0.10 s after 0.21 s; a 1,000-layer stack
# 1.2-2.0 s after 2.2 s).
_WARM_SHARE = 0.5


@dataclass
class Runs:
    """The outcome of each planned run, by name; `get` raises what the run raised. And
    the blocks' predicted checkpoint savings the runs were planned from (or what raised)."""

    outcomes: dict[str, Outcome]
    savings: Outcome

    def get(self, name: str) -> Any:
        return self.outcomes[name].get()

    def has(self, name: str) -> bool:
        return name in self.outcomes


def run_independent(ctx: Context, a: Analysis) -> Runs:
    """Plan the runs the memory pass's parts will read, run them side by side, and keep
    `a.rerun_seconds` the batch-scaling rerun's (warm) seconds, as when they ran in turn."""
    fake_worth = a.on_fake and _WARM_SHARE * a.step_seconds >= forkmap.FORK_WORTH_SECONDS
    planned: dict[str, tuple[Callable[[], Any], bool]] = {}
    gm = ctx.capture.graph_module if ctx.capture is not None else None
    if gm is not None and a.on_fake:
        planned["nodes"] = (lambda: _nodes(ctx, a), fake_worth)
    if a.on_fake:
        planned["batch"] = (lambda: _batch(ctx, a), fake_worth)
    savings = _savings(a)
    if a.on_fake and savings.error is None:
        for paths, on in checkpoint_runs(savings.value, a.train):
            planned[checkpoint_key(on)] = (lambda p=paths, o=on: _checked(a, p, o), fake_worth)
    if _bf16_advised(ctx, a):
        planned["bf16"] = (lambda: _bf16(a), fake_worth)
    planned["step costs"] = (lambda: _step_costs(ctx, a), False)  # one optimizer step each
    outcomes = side_by_side(list(planned.values()))
    runs = Runs(dict(zip(planned, outcomes, strict=True)), savings)
    if runs.has("batch") and runs.outcomes["batch"].error is None:
        _, seconds = runs.get("batch")
        a.rerun_seconds = a.rerun_seconds if seconds is None else seconds
    return runs


def checkpoint_groups(savings: list[tuple[int, str, str]]) -> dict[str, str]:
    """Each advised block -> the block its run is on: the first of its group of
    same-type blocks with the same predicted saving."""
    firsts: dict[tuple[str, int], str] = {}
    return {
        path: firsts.setdefault((kind, predicted), path)
        for predicted, path, kind in savings[: advice.TOP]
    }


def checkpoint_key(on: str) -> str:
    """The name of the checkpoint run on block `on` ("": every block at once)."""
    return f"checkpoint {on or '(every block)'}"


def checkpoint_runs(
    savings: list[tuple[int, str, str]], train: TrainResult
) -> list[tuple[list[str], str]]:
    """(the blocks checkpointed, what the run is on): one run per group (on its first
    block), and every block at once (on ""). A run whose blocks can free under the
    advice's share of the peak, predicted and at most (`checkpoint_bound`), is not made:
    its advice would be left out either way, and with it the set-ups' checkpointed rows
    (at its zoo size, GoogLeNet's five group runs: 0.9 s of its 3.3 s memory pass)."""
    least = advice.meaningful_bytes(train.peak_bytes)

    def may_show(paths: list[str], predicted: int) -> bool:  # the bound only when needed
        return predicted >= least or advice.checkpoint_bound(train, paths) >= least

    predicted = {path: saving for saving, path, _ in savings}
    runs = [
        ([on], on)
        for on in dict.fromkeys(checkpoint_groups(savings).values())
        if may_show([on], predicted[on])
    ]
    every = [path for _, path, _ in savings]
    if len(every) > 1 and may_show(every, sum(predicted.values())):
        runs.append((every, ""))
    return runs


def graph_inputs(ctx: Context, a: Analysis) -> Inputs:
    """The captured graph's own calling convention: an export of the flattening wrapper
    takes the input tensors positionally."""
    gm = ctx.capture.graph_module
    flat = gm is not None and gm.meta.get(FLAT_INPUTS)  # an fx trace of the same wrapper
    if flat or (ctx.capture.method == "export" and ctx.capture.strip == WRAPPED):
        return Inputs(args=tuple(flat_tensors(a.inputs.args, a.inputs.kwargs)))
    return a.inputs


def _savings(a: Analysis) -> Outcome:
    try:
        return Outcome(advice.block_savings(a.model, a.train.saved, a.train.module_outputs))
    except Exception as exc:  # noqa: BLE001 - the advice part raises it, and says why
        return Outcome(error=exc)


def _bf16_advised(ctx: Context, a: Analysis) -> bool:
    float32 = any(p.dtype == torch.float32 for p in ctx.model.parameters())
    return a.opts.autocast is None and float32 and a.on_fake


def _nodes(ctx: Context, a: Analysis) -> NodeMemory:
    gm = fake_shadow(ctx.capture.graph_module, a.opts.fake_mode)
    return node_memory(gm, graph_inputs(ctx, a), a.opts)


def _batch(ctx: Context, a: Analysis) -> tuple[list, float | None]:
    """The runs at the batch and twice it, and the rerun's seconds (None: no batch dim,
    no rerun)."""
    runs = batch_runs(ctx, a)
    return runs, (a.rerun_seconds if runs else None)


def _checked(a: Analysis, paths: list[str], on: str) -> advice.Checked:
    run = run_checkpointed(a, paths)
    return advice.Checked(
        run.saving(a.train), run.saved_bytes, run.fb_peak_bytes, run.peak_bytes, on
    )


def _bf16(a: Analysis) -> AutocastStep:
    bf16 = rerun(a, a.inputs, autocast=torch.bfloat16)
    return AutocastStep(bf16.saved_bytes, fb_peak(bf16))


def _step_costs(ctx: Context, a: Analysis) -> dict[str, tuple[int, int]]:
    """Each compared optimizer's (state bytes, step temporaries): one fake step each, but
    the analysis's own, whose step was measured so already (`analysed_step_cost`)."""
    trainable = [p for p in unique_tensors(a.model.parameters()) if p.requires_grad]
    names = sorted(set(setups.COMPARED_OPTIMIZERS) | {ctx.options.optimizer})
    known = analysed_step_cost(a)
    stepped = [name for name in names if name not in known]
    costs = setups.step_costs(trainable, stepped, a.opts.fake_mode or new_fake_mode())
    return {name: known.get(name) or costs[name] for name in names}


def analysed_step_cost(a: Analysis) -> dict[str, tuple[int, int]]:
    """{the analysis's optimizer: (state bytes, temporaries)} where its tracked step is
    the step `setups.step_cost` makes: on fake tensors, its bytes unrounded, over the same
    parameters (its step ran over the deciding ones, the rest given their kind's state),
    with nothing else allocated during it. A fake AdamW step over MobileNetV3-small's
    deciding parameters: 0.15 s a report."""
    train, opts = a.train, a.opts
    same = a.on_fake and opts.round_to == 1 and opts.resident_state_bytes is None
    if not same or train.optimizer_step_bytes is None:
        return {}
    return {opts.optimizer: (train.optimizer_bytes, train.optimizer_step_bytes)}
