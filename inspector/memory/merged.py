"""The measured step (measure.py) merged into the gradients pass: one real forward and
backward fewer for a report (issue #17).

A report that runs both on the CPU without autocast has two real forwards and backwards
of the same model on the same inputs, with the same seed: the gradients pass's and the
measured step's. Here the gradients pass's is the measured one. The same allocation-only
profiler records it (allocations.py), and the inspector's own work inside it (value
statistics, the train/eval comparison and its copies, gradient statistics, the
random-direction loss) runs in `allocations.ours` windows, whose allocations and their
frees are left out. What a forward and backward cannot show, the lane beside measures
without them (`measure_optimizer_phase`: the copy of the weights and inputs, the
optimizer's state, one `step()` over zero gradients); `combine` puts the two together
into the figures the separate step gives (bench/merged_step.py probed it; the tests
compare both ways byte for byte).

It is planned where real runs are the dear ones (`_real_runs_dear`), and the measured
step's forward and backward only where they are the same: every module
in train mode, the sample inputs (no synthesized targets), the loss the step forms (the
user's `loss_fn` returning a scalar, or the default over float32 outputs, whose backward
allocates what the step's mean does: outputs.make_loss), the eager backward (not the
replay's), a gradient for every trainable parameter. Where one of these fails, the
gradients pass runs the separate measured step itself (`StepRecording.refused`).
"""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from inspector.context import Context, Inputs
from inspector.memory.allocations import (
    WINDOW_PREFIX,
    Recorded,
    allocations_recorded,
    lifetimes,
    ours_left_out,
    read_events,
)
from inspector.memory.measure import Measurement, OptimizerPhase, SavedInputs
from inspector.memory.step import StepOptions
from inspector.realcost import real_runs_dear_by_graph

__all__ = ["planned", "StepFigures", "StepRecording", "combine"]

_LOSS = "loss"  # an instant: the loss is formed (window names, without the prefix)
_BACKWARD = "backward"


def planned(ctx: Context) -> bool:
    """Whether the gradients pass's forward and backward are to stand for the measured
    step's: decided before either runs, the same in the lane and the line."""
    from inspector.detection import synthesized_targets
    from inspector.memory.analysis import AUTOCAST_DTYPES

    options = ctx.options
    if options.fake or not options.measure or options.device != "cpu":
        return False
    if not (options.wants("memory") and options.wants("gradients")):
        return False
    if AUTOCAST_DTYPES.get(options.dtype) is not None:
        return False
    if not all(m.training for m in ctx.model.modules()):
        return False  # the step runs train(); the gradients pass the model as it stands
    if synthesized_targets(ctx.model, ctx.inputs) is not None:
        return False
    return _real_runs_dear(ctx)


def _real_runs_dear(ctx: Context) -> bool:
    """Whether real runs are the dear ones, as the lanes beside judge it when they start
    (before the memory pass: inspector/realcost.py), so the lane and the line agree. Only
    then is the merge worth it: the lane is one real step lighter, and the line pays the
    recording (a tenth of the gradients pass) and, where the forward turns out not to be
    the step's, the step itself. Where fake runs are dear, the step's own lane costs the
    line nothing (mobilenet_v3_small, LeViT, EfficientNet-B0 and Swin-T at the zoo's sizes
    were 0.05-0.9 s slower merged)."""
    return real_runs_dear_by_graph(ctx)


@dataclass
class StepFigures:
    """The recorded forward and backward, in bytes above what was live as it began."""

    peak_bytes: int  # the forward's and backward's peak
    saved_bytes: int  # what autograd saved, the inputs it saved included, the loss not
    backward_end_bytes: int  # live as the backward ends: the gradients and what stays
    seconds: float


class StepRecording:
    """The gradients pass's forward and backward, recorded as the measured step's. Used
    by `backward_once` (health/backprop.py): `session` around it, `begin` as the forward
    starts, `loss_formed`, `backward` around the backward, then `finish`. `refuse(why)`
    wherever the run stops being the step's; `figures` is None then."""

    def __init__(self, inputs: Inputs) -> None:
        self._saved_inputs = SavedInputs(inputs, StepOptions())
        self._stack: ExitStack | None = None
        self._roots: Any = None
        self._hooks: Any = None
        self._began = 0.0
        self._loss_bytes = 0  # the step's loss, where ours was formed in a window
        self.figures: StepFigures | None = None
        self.refused: str | None = None

    @contextmanager
    def session(self) -> Any:
        with ExitStack() as stack:
            self._stack = stack
            try:
                yield self
            finally:
                self._stack = None
        if self.figures is None and self.refused is None:
            self.refused = "the forward and backward did not finish"

    def begin(self) -> None:
        """The forward starts: the recording and the saved-inputs hook."""
        self._roots = self._stack.enter_context(allocations_recorded())
        self._stack.enter_context(ours_left_out())
        self._hooks = self._saved_inputs.watched()
        self._hooks.__enter__()
        self._stack.callback(self._unhook)  # where the run stops before its loss
        self._began = time.perf_counter()

    def _unhook(self) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None

    def loss_formed(self, step_loss_bytes: int) -> None:
        """The loss is formed: what autograd saved is known. `step_loss_bytes`: what the
        step's own loss holds where ours was formed in a window (the default loss), else
        0 (the user's loss_fn, recorded as it ran)."""
        self._unhook()
        self._loss_bytes = step_loss_bytes
        with torch.profiler.record_function(WINDOW_PREFIX + _LOSS):
            pass

    def backward(self) -> Any:
        return torch.profiler.record_function(WINDOW_PREFIX + _BACKWARD)

    def refuse(self, why: str) -> None:
        if self.refused is None:
            self.refused = why

    def finish(self, loss: torch.Tensor | None) -> None:
        """The backward is done: stop recording and work the figures out. `loss`: the
        user's loss_fn's, recorded (the step leaves it out of the saved bytes)."""
        seconds = time.perf_counter() - self._began
        self._stack.close()
        if self.refused is not None:
            return
        recorded = read_events(self._roots())
        if _LOSS not in recorded.windows or _BACKWARD not in recorded.windows:
            self.refuse("the recording lost its marks")
            return
        kept_loss = loss.untyped_storage().nbytes() if loss is not None else 0
        self.figures = _figures(recorded, self._loss_bytes, kept_loss, seconds)
        self.figures.saved_bytes += self._saved_inputs.saved_bytes


def _figures(recorded: Recorded, loss_bytes: int, kept_loss: int, seconds: float) -> StepFigures:
    """The running sum of what the recording saw allocated outside our windows
    (`allocations.lifetimes`), up to the backward's end; the step's loss, where ours was
    not counted, is live from its formation on."""
    loss_at = recorded.windows[_LOSS][0]
    backward_end = recorded.windows[_BACKWARD][1]
    live, peak, saved = 0, 0, None
    for t, size in lifetimes(recorded.events, recorded.ours):
        if t > backward_end:
            break
        if saved is None and t >= loss_at:
            saved, live = live, live + loss_bytes
            peak = max(peak, live)
        live += size
        peak = max(peak, live)
    if saved is None:  # nothing allocated from the loss on
        saved, live = live, live + loss_bytes
        peak = max(peak, live)
    return StepFigures(
        peak_bytes=peak,
        saved_bytes=saved - kept_loss,
        backward_end_bytes=live,
        seconds=seconds,
    )


def combine(phase: OptimizerPhase, step: StepFigures) -> Measurement:
    """The measured step's figures from the lane's optimizer phase and the gradients
    pass's recorded forward and backward: the step begins on the resident bytes, its
    forward on what `train()` left of them, and the optimizer's step adds, to what the
    backward left, what it added to the zero gradients."""
    start = phase.training_bytes  # the step's own peak counts what train() let go of
    step_extra = phase.step_peak_bytes - phase.with_grads_bytes
    train_peak = max(
        phase.resident_bytes,
        start + step.peak_bytes,
        start + step.backward_end_bytes + step_extra,
    )
    return Measurement(
        method="torch.profiler",
        device="cpu",
        forward_peak_bytes=phase.forward_peak_bytes,
        saved_activation_bytes=step.saved_bytes,
        train_peak_bytes=train_peak,
        step_seconds=step.seconds + phase.seconds,
    )


def trains_every_parameter(model: nn.Module, grads: dict[str, Any]) -> bool:
    """Whether every trainable parameter got a gradient (the step's optimizer then steps
    each, as the lane's over zero gradients does)."""
    return all(name in grads for name, p in model.named_parameters() if p.requires_grad)
