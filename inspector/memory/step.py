"""One tracked training step and one tracked inference forward.

The training step, the definition every figure here follows (and `measure.py` too):
  before: parameters, buffers, the inputs and the optimizer state are resident (state
  allocated lazily by an earlier `step()`, as real optimizers do); gradients are None
  (`zero_grad(set_to_none=True)` ended the previous step).
  step: forward (under autocast when asked) -> loss (the output is released, only the
  loss is held) -> backward (gradients allocated) -> optimizer.step() ->
  zero_grad(set_to_none=True).
  peak: the most bytes live at any op of the step: params + buffers + inputs + optimizer
  state + activations + gradients + temporaries.
Gradient accumulation (`micro_steps` > 1): forward -> loss -> backward that many times
before the optimizer step; from the second on, the forward runs with the gradients of the
earlier ones resident, as in a real accumulation loop (two show its steady state).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from inspector.context import Inputs
from inspector.memory.kinds import copy_state_by_kind, stepping
from inspector.memory.labels import module_labels, tag_graph
from inspector.memory.loss import compute_loss
from inspector.memory.optimizer import make_optimizer, state_bytes_of
from inspector.memory.saved import SavedTracker
from inspector.memory.tracker import LiveTracker, Point, storage_key
from inspector.memory.warmup import state_allocation_only, without_inplace_arithmetic

__all__ = ["StepOptions", "TrainResult", "ForwardResult", "train_step", "forward_run", "warm_up"]

INPUT_LABEL = "(input)"
LOSS_LABEL = "(loss)"
OPTIMIZER_LABEL = "(optimizer.step)"


@dataclass
class StepOptions:
    optimizer: str = "adamw"
    autocast: torch.dtype | None = None  # bf16 / fp16 activations
    device: str = "cpu"
    round_to: int = 1  # 512 on CUDA
    loss_fn: Callable[[Any, Inputs], torch.Tensor] | None = None
    fake_mode: Any = None  # run under this FakeTensorMode
    # Skip the optimizer: its state is this many bytes, resident (a cheaper re-run at
    # another batch size or dtype; the optimizer phase does not depend on either).
    resident_state_bytes: int | None = None
    micro_steps: int = 1  # forward + backward passes per optimizer step (accumulation)
    seed: int = 0  # a real copy's step: the random draws it takes (see analysis._real_train)


@dataclass
class TrainResult:
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    optimizer_bytes: int
    grad_bytes: int
    saved_bytes: int
    saved_by_label: dict[str | None, int]
    peak_bytes: int
    peak_label: str | None
    peak_phase: str
    phase_peaks: dict[str, int]
    points: list[Point] = field(default_factory=list)
    windows: list[tuple[str, int]] = field(default_factory=list)  # LiveTracker.windows
    saved: dict[int, tuple[int, str | None]] = field(default_factory=dict)  # key -> (bytes, by)
    # storage key -> the module stacks its saves ran under (inspector/memory/saved.py)
    savers: dict[int, set[tuple[str, ...]]] = field(default_factory=dict)
    module_outputs: dict[str, set[int]] = field(default_factory=dict)  # path -> storage keys
    module_output_bytes: dict[str, int] = field(default_factory=dict)  # path -> bytes
    unmodelled: set[str] = field(default_factory=set)  # ops whose kernel memory is left out
    # what the optimizer's step allocated on top of what was live as it began (None: no
    # step ran); the set-ups read it as `setups.step_cost` measures it (independent.py)
    optimizer_step_bytes: int | None = None


@dataclass
class ForwardResult:
    peak_bytes: int
    peak_label: str | None
    points: list[Point]
    unmodelled: set[str] = field(default_factory=set)


def unique_tensors(tensors: Any) -> list[torch.Tensor]:
    """Each storage once (tied weights share one)."""
    seen: dict[int, torch.Tensor] = {}
    for t in tensors:
        seen.setdefault(storage_key(t), t)
    return list(seen.values())


def warm_up(
    optimizer: torch.optim.Optimizer | None,
    params: list[nn.Parameter],
    shorten: bool = True,
    values: bool = True,
) -> None:
    """Allocate the optimizer's state the way its first step does, with zero gradients.
    On fake tensors the step's in-place arithmetic is skipped (inspector.memory.warmup):
    the state comes out the same, at a fraction of the cost. `shorten`: the step runs
    over the parameters that decide its bytes, the rest get their kind's state
    (inspector.memory.kinds). `values` False: on real tensors too, the state is allocated
    without the step's arithmetic (inspector.memory.warmup); the weights keep their values
    (AdamW's decay is skipped with the rest)."""
    if optimizer is None:
        return
    with stepping(optimizer, params) if shorten else nullcontext(params) as stepped:
        for p in stepped:
            p.grad = torch.zeros_like(p)
        with state_allocation_only(stepped) if not values else without_inplace_arithmetic(stepped):
            optimizer.step()
    copy_state_by_kind(optimizer, params, stepped)
    optimizer.zero_grad(set_to_none=True)


def _autocast(opts: StepOptions):  # noqa: ANN202
    if opts.autocast is None:
        return nullcontext()
    return torch.autocast(device_type=opts.device, dtype=opts.autocast)


def _linear_biases(model: nn.Module) -> list[torch.Tensor]:
    """The biases F.linear adds (see LiveTracker._adds_bias): nn.Linear's, and the input
    projections' of nn.RNN, nn.GRU and nn.LSTM where they run as a linear (not oneDNN's
    fused kernel)."""
    found = []
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.bias is not None:
            found.append(module.bias)
        elif isinstance(module, nn.RNNBase) and module.bias:
            found += [
                p
                for name, p in module.named_parameters(recurse=False)
                if name.startswith("bias_ih")
            ]
    return found


def _register_static(tracker: LiveTracker, model: nn.Module, inputs: Inputs) -> dict[str, int]:
    params = unique_tensors(model.parameters())
    buffers = unique_tensors(model.buffers())
    for t in params + buffers:
        tracker.add(t, "static", "(parameters)")
    tracker.add_all(inputs.tensors(), "input", INPUT_LABEL)
    tracker.linear_biases = {storage_key(bias) for bias in _linear_biases(model)}
    return {
        "param": sum(t.untyped_storage().nbytes() for t in params),
        "buffer": sum(t.untyped_storage().nbytes() for t in buffers),
        "input": tracker.bytes_where("input"),
    }


def train_step(model: nn.Module, inputs: Inputs, opts: StepOptions) -> TrainResult:
    """Run one tracked training step on `model` (mutated: use a shadow copy)."""
    model.train()
    trainable = [p for p in unique_tensors(model.parameters()) if p.requires_grad]
    with opts.fake_mode or nullcontext():
        optimizer = None
        if opts.resident_state_bytes is None:
            optimizer = make_optimizer(opts.optimizer, trainable)
            warm_up(optimizer, trainable)
        return _tracked_step(model, inputs, opts, optimizer, trainable)


def _tracked_step(
    model: nn.Module,
    inputs: Inputs,
    opts: StepOptions,
    optimizer: torch.optim.Optimizer | None,
    trainable: list[nn.Parameter],
) -> TrainResult:
    tracker = LiveTracker(round_to=opts.round_to)
    static = _register_static(tracker, model, inputs)
    if optimizer is not None:
        for state in optimizer.state.values():
            tracker.add_all(list(state.values()), "static", OPTIMIZER_LABEL)
    tracker.live += opts.resident_state_bytes or 0
    exclude = {storage_key(t) for t in [*model.parameters(), *model.buffers()]}
    tracker.mark(INPUT_LABEL)
    with tracker, module_labels(model, tracker, tag=True) as calls:
        for micro in range(opts.micro_steps):
            if micro:  # the next micro-batch: its forward, the gradients so far resident
                tracker.set_phase("forward")
            with SavedTracker(tracker, exclude) as saved, _autocast(opts):
                tracker.label = None
                output = inputs.call(model)
                tracker.label = LOSS_LABEL
                loss = compute_loss(opts.loss_fn, output, inputs)
                tag_graph(loss, LOSS_LABEL)
                del output
            tracker.mark(LOSS_LABEL)
            tracker.set_phase("backward")
            loss.backward()
        grad_bytes = sum(p.grad.untyped_storage().nbytes() for p in trainable if p.grad is not None)
        tracker.set_phase("optimizer")
        tracker.label = OPTIMIZER_LABEL
        step_bytes = None
        if optimizer is not None:  # the same bytes over the deciding parameters alone
            began = tracker.live
            with stepping(optimizer, trainable) as stepped, without_inplace_arithmetic(stepped):
                every_one = all(p.grad is not None for p in stepped)  # else it skips some
                optimizer.step()
            step_bytes = tracker.phase_peaks["optimizer"] - began if every_one else None
            tracker.mark(OPTIMIZER_LABEL)
        for p in trainable:
            p.grad = None
        tracker.mark("(zero_grad)")
    if opts.resident_state_bytes is not None:
        tracker.phase_peaks.pop("optimizer", None)
    return TrainResult(
        param_bytes=static["param"],
        buffer_bytes=static["buffer"],
        input_bytes=static["input"],
        optimizer_bytes=state_bytes_of(optimizer) + (opts.resident_state_bytes or 0),
        grad_bytes=grad_bytes,
        saved_bytes=saved.total_bytes,
        saved_by_label=saved.by_producer(),
        peak_bytes=tracker.peak,
        peak_label=tracker.peak_label,
        peak_phase=tracker.peak_phase,
        phase_peaks=dict(tracker.phase_peaks),
        points=tracker.timeline(),
        windows=tracker.windows(),
        saved=saved.saved,
        savers=saved.savers,
        module_outputs=calls.outputs,
        module_output_bytes=calls.output_bytes,
        unmodelled=set(tracker.unmodelled),
        optimizer_step_bytes=step_bytes,
    )


def forward_run(model: nn.Module, inputs: Inputs, opts: StepOptions) -> ForwardResult:
    """One tracked inference forward: eval mode, under no_grad."""
    model.eval()
    tracker = LiveTracker(round_to=opts.round_to)
    with opts.fake_mode or nullcontext():
        _register_static(tracker, model, inputs)
        tracker.mark(INPUT_LABEL)
        with torch.no_grad(), tracker, module_labels(model, tracker, tag=False), _autocast(opts):
            output = inputs.call(model)
            del output
            tracker.mark("(output released)")
    return ForwardResult(
        tracker.peak, tracker.peak_label, tracker.timeline(), set(tracker.unmodelled)
    )
