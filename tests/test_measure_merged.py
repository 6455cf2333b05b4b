"""The measured step merged into the gradients pass (inspector/memory/merged.py): the
gradients pass's recorded forward and backward, with the lane's optimizer phase, give the
figures the separate measured step gives, byte for byte, and the separate step runs in
its place wherever that forward and backward are not the step's."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_measure_inference import Encoder, Recurrent  # noqa: F401 - loaded by name below
from torch import nn

from inspector.analyze import inspect_model
from inspector.context import Options
from inspector.health.outputs import make_loss
from inspector.memory import measure as measure_module
from inspector.memory import merged
from inspector.memory.allocations import Recorded
from inspector.memory.measure import OptimizerPhase
from inspector.memory.merged import StepFigures, _figures, combine
from inspector.passes import gradients as gradients_pass

F32 = 4
PASSES = {"memory", "gradients", "numerics", "modes"}


class ResidualNet(nn.Module):
    """Conv, BatchNorm, in-place ReLU, a residual add, pooling, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.relu = nn.ReLU(inplace=True)
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.stem(x))
        y = self.relu(self.block(y) + y)
        return self.head(nn.functional.max_pool2d(y, 2).flatten(1))


class WideHead(nn.Module):
    """Weights far larger than its activations: the step peaks in the optimizer's step."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(256, 512)
        self.b = nn.Linear(512, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class TwoOutputs(nn.Module):
    """A tuple out: the loss is formed over both."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.a(x))
        return h, self.b(h)


class EvalCache(nn.Module):
    """Keeps a table made by its eval() forward and lets it go on train(), as LeViT's
    attention biases do: the step's training forward starts without it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.cache: torch.Tensor | None = None

    def train(self, mode: bool = True) -> EvalCache:
        if mode:
            self.cache = None
        return super().train(mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training and self.cache is None:
            self.cache = torch.ones(4096)
        return self.proj(x)


class HasUnused(nn.Module):
    """A trainable layer the forward never calls: it gets no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(16, 16)
        self.unused = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


class Float64Out(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).double()


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return x * 2

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return grad * 2


class CustomFunction(nn.Module):
    """An autograd.Function fx does not keep: the gradients pass replays the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Scale.apply(self.proj(x))


CASES = {
    "ResidualNet": '{"x": {"shape": [4, 3, 16, 16]}}',
    "Encoder": '{"x": {"shape": [2, 12, 32]}}',
    "Recurrent": '{"x": {"shape": [3, 7, 16]}}',
    "WideHead": '{"x": {"shape": [2, 256]}}',
    "TwoOutputs": '{"x": {"shape": [4, 16]}}',
    "EvalCache": '{"x": {"shape": [4, 16]}}',
}
SEPARATE = {
    "HasUnused": "a trainable parameter got no gradient",
    "Float64Out": "an output the loss is formed from is not float32",
    "CustomFunction": "the per-node replay's backward ran",
}


def _report(name: str, monkeypatch, merge: bool) -> tuple:  # noqa: ANN001
    """The report's measured figures, how many training forwards the measured step ran
    of its own, and why the gradients pass's were not the step's (None: they were)."""
    steps: list[int] = []
    train_step = measure_module._train_step
    monkeypatch.setattr(measure_module, "_train_step", lambda *a: steps.append(1) or train_step(*a))
    refused: list[str | None] = []
    measured = gradients_pass._step_measured

    def spy(ctx, step, result) -> None:  # noqa: ANN001
        measured(ctx, step, result)
        refused.append(step.refused)

    monkeypatch.setattr(gradients_pass, "_step_measured", spy)
    # these models are small: fake runs are their dear ones, where the merge is not planned
    monkeypatch.setattr(merged, "_real_runs_dear", lambda ctx: merge)
    spec = CASES.get(name, '{"x": {"shape": [4, 16]}}')
    report = inspect_model(f"{__file__}:{name}", spec, Options(passes=PASSES, isolate=False))
    m = report.memory.measured
    monkeypatch.undo()
    figures = (m.forward_peak_bytes, m.saved_activation_bytes, m.train_peak_bytes)
    return figures, len(steps), refused[0] if refused else "not recorded"


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_merged_step_gives_the_separate_steps_figures(name: str, monkeypatch) -> None:
    merged_figures, own_steps, refused = _report(name, monkeypatch, merge=True)
    separate_figures, separate_steps, _ = _report(name, monkeypatch, merge=False)
    assert refused is None and own_steps == 0  # the gradients pass's forward was the step's
    assert separate_steps == 1
    assert merged_figures == separate_figures


def test_a_step_that_peaks_in_the_optimizer_is_seen_by_the_lanes_phase(monkeypatch) -> None:
    """WideHead at [2, 256]: its forward and backward peak below what the optimizer's
    step holds (weights, state, gradients, AdamW's temporaries): the phase sets it."""
    (_, _, train_peak), _, _ = _report("WideHead", monkeypatch, merge=True)
    weights = (256 * 512 + 512 + 512 * 256 + 256) * F32
    # weights, two AdamW moments, gradients: four times the weights, and more in step()
    assert train_peak > 4 * weights


@pytest.mark.parametrize("name", sorted(SEPARATE))
def test_where_the_forward_is_not_the_steps_the_separate_step_runs(name: str, monkeypatch) -> None:
    merged_figures, own_steps, refused = _report(name, monkeypatch, merge=True)
    separate_figures, _, _ = _report(name, monkeypatch, merge=False)
    assert refused == SEPARATE[name]
    assert own_steps == 1  # run by the gradients pass in the recording's place
    assert merged_figures == separate_figures


def test_planned_where_real_runs_are_dear_in_train_mode_on_the_cpu() -> None:
    from inspector.health.adhoc import context_for

    model = ResidualNet()
    ctx = context_for(model, (torch.randn(2, 3, 16, 16),))
    assert not merged.planned(ctx)  # no timings yet: real runs are not known to be dear
    ctx.results.real_forward_seconds = 0.30  # ResNet-18 at [8, 3, 224, 224]: a real
    ctx.report.meta.timings_s["graph"] = 0.07  # forward 0.3 s, the graph pass 0.07 s
    assert merged.planned(ctx)
    model.eval()
    assert not merged.planned(ctx)
    model.train()
    ctx.options.dtype = "bf16"  # autocast: the step's bytes are others
    assert not merged.planned(ctx)
    ctx.options.dtype = "float32"
    ctx.report.meta.timings_s["graph"] = 0.5  # fake runs dear: the step's own lane is free
    assert not merged.planned(ctx)


def test_the_default_loss_gradient_is_the_random_directions() -> None:
    """The loss's backward makes one tensor of the output's size (the step's mean does
    too); the gradient is still exactly that of mean(output * r)."""
    torch.manual_seed(0)
    layer = nn.Linear(6, 5)
    x = torch.randn(4, 6)
    out = layer(x)
    loss, _ = make_loss(out, None, None)
    got = torch.autograd.grad(loss, layer.weight)[0]
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(20_161))
    expected = torch.autograd.grad((layer(x) * r).mean(), layer.weight)[0]
    assert torch.equal(got, expected)
    assert loss.item() == pytest.approx((out * r).mean().item(), rel=1e-7)


def test_figures_by_hand() -> None:
    """Allocations 1-11 ns; `ours` windows [3, 4] and [8, 8]; the loss marked at 6, the
    backward over [7, 10]. What a window allocated, and its free, are left out; a free of
    what the recording never saw is dropped; the step's loss (4 B) is live from 6 on."""
    a, b, c, mine, g, foreign = 0xA, 0xB, 0xC, 0xD, 0xE, 0xF
    events = [
        (1, 100, a),  # an activation autograd saves
        (2, 50, b),  # the output
        (3, 1000, mine),  # our statistics' buffer: left out
        (4, -1000, mine),
        (5, -50, b),  # the output dropped as the loss is formed
        (7, 30, c),  # the gradient of the output
        (8, 500, mine),  # our gradient statistics: left out
        (9, 60, g),  # a parameter's gradient
        (9, -30, c),
        (9, -64, foreign),  # never allocated here: dropped
        (10, -100, a),  # the saved activation, freed by the backward
        (11, 7, a),  # after the backward: not the step's
    ]
    recorded = Recorded(
        events=events,
        windows={"loss": (6, 6), "backward": (7, 10)},
        ours=[(3, 4), (8, 8)],
    )
    figures = _figures(recorded, loss_bytes=4, kept_loss=0, seconds=0.5)
    assert figures.saved_bytes == 100  # live as the loss is formed: the saved activation
    assert figures.peak_bytes == 100 + 4 + 30 + 60  # 194, as the parameter's grad arrives
    assert figures.backward_end_bytes == 4 + 60  # the loss and the gradient
    # the user's loss_fn's loss, recorded as it ran, is left out of the saved bytes
    user = _figures(recorded, loss_bytes=0, kept_loss=8, seconds=0.5)
    assert user.saved_bytes == 92 and user.peak_bytes == 190


def _step(peak: int) -> StepFigures:
    return StepFigures(peak_bytes=peak, saved_bytes=200, backward_end_bytes=304, seconds=1.0)


def test_combine_by_hand() -> None:
    """Resident 1,000 B (weights, inputs, state); zero gradients make it 1,300 and the
    optimizer's step peaks at 1,420: 120 B on top of the gradients."""
    phase = OptimizerPhase(
        setup_bytes=600,
        resident_bytes=1000,
        training_bytes=1000,
        with_grads_bytes=1300,
        step_peak_bytes=1420,
        forward_peak_bytes=750,
        seconds=0.1,
    )
    # the backward ends holding the gradients (300) and the loss (4)
    m = combine(
        phase, StepFigures(peak_bytes=500, saved_bytes=200, backward_end_bytes=304, seconds=1)
    )
    assert m.train_peak_bytes == 1000 + 500  # the forward/backward's peak is the larger
    assert (m.saved_activation_bytes, m.forward_peak_bytes) == (200, 750)
    m = combine(
        phase, StepFigures(peak_bytes=400, saved_bytes=200, backward_end_bytes=304, seconds=1)
    )
    assert m.train_peak_bytes == 1000 + 304 + 120  # the optimizer's step is
    assert m.step_seconds == pytest.approx(1.1)
    # train() let go of 900 B the model kept from eval(): the step began above its forward
    cached = replace(phase, resident_bytes=1900, step_peak_bytes=1420)
    assert combine(cached, _step(peak=400)).train_peak_bytes == 1900
