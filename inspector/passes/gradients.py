"""Gradient flow: one forward + backward, per-parameter and per-layer gradient health.

The loss is the user's `loss_fn(output, inputs)`, else the sum over the floating outputs
of mean(output * r), r a fixed random tensor (see inspector.health.outputs.DEFAULT_LOSS).
The model's modes, buffers, RNG state and `.grad`s are restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from inspector.context import Context, Inputs
from inspector.detection import training_inputs
from inspector.health.backprop import (
    AutogradGraph,
    BackwardRun,
    ForwardWatch,
    OwnBackward,
    backward_once,
)
from inspector.health.eagergraph import EagerGraphNodes
from inspector.health.gradrows import layer_rows, module_grad_norms, param_rows
from inspector.health.nodegrads import (
    ExpectedLoss,
    LossDiverged,
    NodeGrads,
    OnEagerForward,
    node_grads,
)
from inspector.health.outputs import LossOutput, directions_kept
from inspector.health.state import preserved
from inspector.health.thresholds import GRADIENT_KEYS, resolve
from inspector.health.values import replays_graph
from inspector.memory import merged
from inspector.memory.merged import StepRecording
from inspector.passes import measure as measure_pass
from inspector.passes.modes import TrainRecorder, shares_train_forward
from inspector.passes.numerics import Observer
from inspector.report import Gradients

__all__ = ["run", "FAKE_NOTE"]

FAKE_NOTE = "not computed: fake tensors carry no values (run without --fake for gradients)"


def run(ctx: Context) -> None:
    section = ctx.report.gradients
    th = resolve(ctx.options)
    section.thresholds = {key: th[key] for key in GRADIENT_KEYS}
    if ctx.options.fake:
        section.computed, section.error = False, FAKE_NOTE
        return
    inputs = ctx.inputs
    with preserved(ctx.model), training_inputs(ctx, "gradients"), directions_kept():
        # the forward is modes' train() run too, when the model trains as it stands
        recorder = TrainRecorder() if ctx.inputs is inputs and shares_train_forward(ctx) else None
        # the replay is the forward numerics would run, when the inputs are the sample's
        observer = Observer(ctx) if ctx.options.wants("numerics") and ctx.inputs is inputs else None
        replay = _Replay(ctx, observer)
        fills = replay.fills_grads()
        # the graph's nodes met on this forward: no replay where each is (eagergraph.py)
        met = EagerGraphNodes(ctx, observer) if fills else None
        # no graph to replay: the per-node grads are the module calls', of this forward
        along = OnEagerForward(observer) if not fills and not replays_graph(ctx) else None
        watch = _Watches(recorder, along, met)
        # the measured training step's forward and backward too, where they are the same
        step = StepRecording(ctx.inputs) if _measures_step(ctx, inputs) else None
        result = backward_once(ctx, watch, lambda: _replayed(replay, met, observer), step)
        graded = replay.graded
        # per-node grads of this forward and backward: what recorded them, if anything
        eager = met if met is not None and met.matched else along
        if eager is not None:
            eager.result.backward_ran = result.backward_ran
            graded = eager.result if result.backward_ran and eager.error is None else None
            if eager.error is not None and observer is not None:
                observer.reset()  # numerics runs its own forward
        elif graded is None and result.backward_ran:
            graded = _node_grads(ctx, observer) if replay.error is None else None
    skipped = replay.error or (eager.error if eager is not None else None)
    if skipped is not None and result.backward_ran:  # as when it ran after the backward
        ctx.report.meta.warnings.append(f"gradients: per-node gradients skipped ({skipped})")
    if recorder is not None and recorder.finished:  # the forward ran: modes has its run
        ctx.results.modes_train = recorder
    if graded is not None and observer is not None:
        observer.result.method, observer.result.computed = graded.method, True
        ctx.results.numerics_observed = observer.result
    ctx.results.gradients = result
    if step is not None:
        _step_measured(ctx, step, result)
    if result.internal:  # said as the inspector's failure, not as a finding on the model
        ctx.report.meta.warnings.append(f"gradients: {result.error}")
    _fill(ctx, section, result, graded, th)


def _measures_step(ctx: Context, inputs: Inputs) -> bool:
    """Whether this forward and backward stand for the measured step's: planned so before
    the passes ran (the lane beside then measures the rest), and on the sample inputs."""
    return ctx.inputs is inputs and ctx.results.memory is not None and merged.planned(ctx)


def _step_measured(ctx: Context, step: StepRecording, result: BackwardRun) -> None:
    """The recorded step's figures for the measure pass, or, where this forward and
    backward were not the step's, the separate measured step, run here in its place."""
    if result.backward_ran and not merged.trains_every_parameter(ctx.model, result.grads):
        step.refuse("a trainable parameter got no gradient")
    if step.figures is not None and step.refused is None:
        ctx.results.step_recorded = step.figures
    else:
        ctx.results.step_recorded = measure_pass.separate(ctx)


class _Replay:
    """The per-node replay as the gradients' own backward: its forward runs the captured
    fx graph, which calls the model's own modules and parameters, so its backward fills
    the grads the eager backward would. Taken only when its loss is the eager forward's,
    value and autograd graph (a custom autograd.Function or a `torch.no_grad()` block
    that fx does not keep changes the graph): else the eager forward and backward run
    again, then the replay, as before."""

    def __init__(self, ctx: Context, observer: Observer | None) -> None:
        self.ctx, self.observer = ctx, observer
        self.graded: NodeGrads | None = None
        self.error: Exception | None = None  # the replay raised: per-node grads skipped

    def fills_grads(self) -> bool:
        capture = self.ctx.capture
        if capture is None or capture.method != "fx" or capture.graph_module is None:
            return False  # an export graph holds copies and runs other kernels
        own = {id(p) for p in self.ctx.model.parameters()}
        return all(id(p) in own for p in capture.graph_module.parameters())

    def backward(
        self, loss_value: float, graph: AutogradGraph, formed: tuple[LossOutput, ...] | None
    ) -> bool:
        try:
            expect = ExpectedLoss(loss_value, graph, formed)
            graded = node_grads(self.ctx, self.observer, expect)
        except Exception as exc:  # noqa: BLE001 - the eager run says what went wrong
            if not isinstance(exc, LossDiverged):
                self.error = exc
            if self.observer is not None:  # its values are another forward's
                self.observer.reset()
            return False
        self.graded = graded if graded.backward_ran else None
        return graded.backward_ran


def _replayed(
    replay: _Replay, met: EagerGraphNodes | None, observer: Observer | None
) -> OwnBackward | None:
    """The replay's backward in the eager one's place, unless the eager forward met every
    node of the graph (its backward then fills the per-node grads) or there is no graph."""
    if met is None or met.matched:
        return None
    if observer is not None:  # what it saw of the eager forward was not every node
        observer.reset()
    return replay.backward


class _Watches:
    """The forward watches of one eager forward (ForwardWatch), entered in order."""

    def __init__(self, *watches: ForwardWatch | None) -> None:
        self.watches = [w for w in watches if w is not None]

    @contextmanager
    def watching(self, ctx: Context) -> Iterator[None]:
        with ExitStack() as stack:
            for watch in self.watches:
                stack.enter_context(watch.watching(ctx))
            yield

    def finish(self, output: Any) -> None:
        for watch in self.watches:
            watch.finish(output)


def _node_grads(ctx: Context, observer: Observer | None) -> NodeGrads | None:
    try:
        return node_grads(ctx, observer)
    except Exception as exc:  # noqa: BLE001 - per-node grads are extra; keep the rest
        ctx.report.meta.warnings.append(f"gradients: per-node gradients skipped ({exc})")
        return None


def _fill(
    ctx: Context, section: Gradients, result: BackwardRun, graded: NodeGrads | None, th: dict
) -> None:
    section.loss, section.loss_value, section.error = result.loss, result.loss_value, result.error
    # Verdicts stand when backward ran, or when nothing reached the loss at all.
    section.computed = result.backward_ran or result.no_grad_path
    if not section.computed:
        return
    section.params = param_rows(ctx, result, th)
    section.layers = layer_rows(ctx, result, section.params, th)
    norms = module_grad_norms(section.params)
    for module in ctx.report.modules:
        module.grad_norm = norms.get(module.path)
    if graded is not None:
        for node in ctx.report.nodes:
            node.grad_norm = graded.norms.get(node.name)
        section.first_nan_node = graded.first_nan
