"""The measured step's inference forward, recorded on the load's input check
(inspector/memory/inference.py): the same peak as the step's own forward, measured
apart, and the step's own forward where the check's is not one it would repeat."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inspector.analyze import inspect_model
from inspector.context import Inputs, Options
from inspector.fit import check_inputs_fit
from inspector.memory import measure as measure_module
from inspector.memory.inference import InferenceRecording, forward_peak
from inspector.memory.measure import measure
from inspector.memory.step import StepOptions
from inspector.passes.modes import EvalRecorder

F32 = 4


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 24, num_layers=2, batch_first=True)
        self.out = nn.Linear(24, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq, _ = self.lstm(x)
        return self.out(seq[:, -1])


class CachesOnFirstCall(nn.Module):
    """Makes a table at its first call and keeps it: the step's copy has it already."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.table: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.table is None:
            self.table = torch.ones(1000, 16)
        return self.proj(x) + self.table[: x.shape[0]]


class ReplacesItsState(nn.Module):
    """Lets go of the tensor it held before each call and keeps a new one."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.last = torch.zeros(4096)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = torch.zeros(4096)
        return self.proj(x)


CASES = {
    "conv": (ConvNet, (4, 3, 16, 16)),
    "encoder": (Encoder, (2, 12, 32)),
    "lstm": (Recurrent, (3, 7, 16)),
}


def _recorded(model: nn.Module, inputs: Inputs, modes: bool = True) -> int | None:
    """The load's check, as inspector/analyze.py runs it: seeded, modes' eval() recorder
    watching (its copies made during the forward), the recording around the call."""
    recorder = EvalRecorder(inputs) if modes else None
    recording = InferenceRecording(inputs)
    output: list = []

    def keep(out) -> None:  # noqa: ANN001
        if recorder is not None:
            recorder.finish(out)
        output.append(out)

    check_inputs_fit(
        model,
        inputs,
        [],
        seed=0,
        keep=keep,
        watch=recorder.watching(model) if recorder else None,
        around_forward=recording.recorded(),
    )
    copies = recorder.copies() if recorder else []
    if modes:
        assert copies  # the exclusion below is tested: the recorder copied module outputs
    found = recording.finish(output[0], copies)
    return None if found is None else found.peak_bytes


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_checks_forward_gives_the_peak_the_steps_own_forward_measures(case: str) -> None:
    build, shape = CASES[case]
    torch.manual_seed(0)
    model = build()
    inputs = Inputs((torch.randn(*shape),), {})
    peak = _recorded(model, inputs)
    assert peak is not None and peak > 0
    own = measure(model, inputs, StepOptions())
    taken = measure(model, inputs, StepOptions(), inference=peak)
    assert taken.forward_peak_bytes == own.forward_peak_bytes
    assert (taken.saved_activation_bytes, taken.train_peak_bytes) == (
        own.saved_activation_bytes,
        own.train_peak_bytes,
    )
    # without modes' copies to leave out, the same peak
    assert _recorded(model, inputs, modes=False) == peak


def test_a_linear_layers_forward_peak_by_hand() -> None:
    """Linear(64, 32) on [8, 64]: the output (8 x 32 floats) is all it allocates."""
    model = nn.Linear(64, 32)
    inputs = Inputs((torch.randn(8, 64),), {})
    assert _recorded(model, inputs, modes=False) == 8 * 32 * F32
    held = (64 * 32 + 32 + 8 * 64) * F32  # the step's copy of the weights, and the input
    m = measure(model, inputs, StepOptions(), inference=8 * 32 * F32)
    assert m.forward_peak_bytes == held + 8 * 32 * F32


def test_a_forward_that_keeps_or_replaces_state_is_not_taken() -> None:
    x = Inputs((torch.randn(4, 16),), {})
    assert _recorded(CachesOnFirstCall(), x, modes=False) is None
    assert _recorded(ReplacesItsState(), x, modes=False) is None


def test_forward_peak_by_hand() -> None:
    a, b, c, ours, out = 0xA0, 0xB0, 0xC0, 0xD0, 0xE0
    events = [
        (1, 100, a),
        (2, 50, b),
        (3, -100, a),
        (4, 30, ours),  # the inspector's copy: left out
        (5, 200, c),  # 250 live: the peak
        (6, -200, c),
        (7, 10, out),
        (8, -50, b),
    ]
    assert forward_peak(events, {ours}, {out}) == 250
    assert forward_peak(events, set(), {out}) is None  # the copy lives on: not an output
    assert forward_peak(events + [(9, -64, 0xF0)], {ours}, {out}) is None  # freed, not its
    # an address the model used and freed, then our copy's: only the copy is left out
    reused = [(1, 40, ours), (2, -40, ours), (3, 30, ours), (4, 10, out)]
    assert forward_peak(reused, {ours}, {out}) == 40


@pytest.mark.parametrize(("name", "recorded"), [("ConvNet", True), ("CachesOnFirstCall", False)])
def test_the_reports_measured_forward_peak_is_the_steps(
    name: str, recorded: bool, monkeypatch
) -> None:
    """Through the report: the check's recording stands in for the step's forward where
    it is one the step repeats, with the forward peak the step measures alone."""
    spec = '{"x": {"shape": [4, 3, 16, 16]}}' if name == "ConvNet" else '{"x": {"shape": [4, 16]}}'
    own_forwards = []
    inference = measure_module._inference
    monkeypatch.setattr(
        measure_module, "_inference", lambda *a: own_forwards.append(1) or inference(*a)
    )
    options = Options(passes={"memory"}, isolate=False)
    report = inspect_model(f"{__file__}:{name}", spec, options)
    assert len(own_forwards) == (0 if recorded else 1)

    torch.manual_seed(0)
    model = globals()[name]()
    shape = (4, 3, 16, 16) if name == "ConvNet" else (4, 16)
    if name == "CachesOnFirstCall":
        model(torch.randn(*shape))  # as the load's check left it
    alone = measure(model, Inputs((torch.randn(*shape),), {}), StepOptions())
    assert report.memory.measured.forward_peak_bytes == alone.forward_peak_bytes
