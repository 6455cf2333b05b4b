"""A capture leaves the user's model as it found it, and a failure of the inspector's own
machinery is never reported as the model's fault.

HF Swin stores `self.window_size = min(input_resolution)` in forward: fx traced it as a
traced value that stayed on the module, so memory was skipped and the gradient and
train/eval checks failed (`floordiv_6 has no value`), reported as the model's own
`gradients-failed` / `train-mode-failure` though the model trains fine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from inspector.analyze import inspect_model
from inspector.context import Options
from inspector.graph.modelstate import attributes_kept, buffers_kept
from inspector.tracebacks import inspector_fault

EXAMPLES = Path(__file__).parents[1] / "examples"
WINDOWED = """
import torch
from torch import nn


class Windowed(nn.Module):
    '''Swin's habit: the window shrinks to the input, stored on the module.'''

    def __init__(self):
        super().__init__()
        self.window = 4
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        if x.shape[1] <= self.window:
            self.window = x.shape[1]
        return self.lin(x).reshape(x.shape[0], -1, self.window, 8).mean(2)


def example_inputs():
    return torch.randn(2, 3, 8)
"""


def test_a_trace_that_stores_on_the_model_leaves_no_traced_value(tmp_path: Path):
    path = tmp_path / "windowed.py"
    path.write_text(WINDOWED)
    options = Options(passes={"graph", "memory", "gradients", "modes", "findings"}, export="none")
    report = inspect_model(f"{path}:Windowed", None, options)
    assert report.capture.method == "fx"  # guided fx, which traced `self.window = ...`
    assert report.gradients.computed and report.modes.computed
    assert not [f for f in report.findings if f.severity != "info"]
    # one step's saved activations: x [2, 3, 8] for lin's weight grad, float32
    assert report.memory.saved_activation_bytes == report.memory.measured.saved_activation_bytes
    assert not report.meta.warnings


STATEFUL = '''
import torch
from torch import nn


class Stateful(nn.Module):
    """Truncated BPTT: the hidden state kept between calls, detached."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(8, 16)
        self.fc = nn.Linear(16, 2)
        self.hidden = None

    def forward(self, x):
        out, h = self.rnn(x, self.hidden)
        self.hidden = h.detach()
        return self.fc(out[-1])


def example_inputs():
    return torch.randn(6, 3, 8)
'''


def test_a_stateful_rnn_is_traced_with_its_state_not_a_traced_value(tmp_path: Path):
    """Once a forward has run (the load's input check), `self.hidden` is a tensor: fx
    names it in a get_attr node, and its GraphModule copied the attribute from the model
    after the trace had stored a Proxy there (`self.hidden = h.detach()`), so every run of
    the graph failed ("symbolically traced variables cannot be used as inputs to control
    flow") and the whole report with it."""
    from inspector.graph.fxcapture import trace_fx

    path = tmp_path / "stateful.py"
    path.write_text(STATEFUL)
    namespace: dict = {}
    exec(compile(STATEFUL, str(path), "exec"), namespace)  # noqa: S102 - our own text
    model, x = namespace["Stateful"](), torch.randn(6, 3, 8)
    model(x)
    hidden = model.hidden
    gm = trace_fx(model, (x,), {}).graph_module
    assert model.hidden is hidden and gm.hidden is hidden
    assert gm(x).shape == (3, 2)
    options = Options(passes={"graph", "memory", "gradients", "modes", "findings"}, export="none")
    report = inspect_model(f"{path}:Stateful", None, options)
    assert report.capture.method == "fx" and report.gradients.computed
    # rnn, 6 steps of a batch of 3, 8 inputs to 16 hidden: 2 * 6 * 3 * (8 * 16 + 16 * 16)
    # = 13,824; fc: 2 * 3 * 16 * 2 = 192
    assert report.totals.flops_forward == 13_824 + 192
    assert [f.where for f in report.findings if f.rule == "tensor-attribute"] == ["hidden"]
    assert not report.meta.warnings


def test_buffers_changed_in_place_get_their_values_back():
    model = nn.BatchNorm1d(3)
    with buffers_kept(model):
        model.num_batches_tracked.add_(1)
        model.running_mean.fill_(5.0)
    assert int(model.num_batches_tracked) == 0 and model.running_mean.abs().sum() == 0


def test_attributes_and_tables_are_put_back():
    model = nn.Sequential(nn.Linear(2, 2))
    weight = model[0].weight
    with attributes_kept(model):
        model[0].extra = "traced"
        model[0].in_features = object()
        model[0].weight = nn.Parameter(torch.zeros(2, 2))
        model.add_module("new", nn.ReLU())
    assert not hasattr(model[0], "extra") and model[0].in_features == 2
    assert model[0].weight is weight and list(model._modules) == ["0"]


def test_an_error_raised_in_the_inspector_is_its_own_fault():
    from inspector.inputspec import parse_dtype

    with pytest.raises(Exception) as ours:  # noqa: PT011 - whichever: raised in our code
        parse_dtype("no-such-dtype")
    with pytest.raises(RuntimeError) as theirs:
        torch.zeros(2) @ torch.zeros(3)  # a torch op called from the model's line
    assert inspector_fault(ours.value) is True
    assert inspector_fault(theirs.value) is False


def test_an_internal_failure_is_a_warning_of_the_inspector_not_a_finding(monkeypatch):
    from inspector.health import backprop
    from inspector.inputspec import parse_dtype
    from inspector.passes import modes

    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - fails in our own code
        parse_dtype("no-such-dtype")

    monkeypatch.setattr(backprop, "recording", broken)
    monkeypatch.setattr(modes, "run_nodes", broken)
    options = Options(passes={"gradients", "modes", "findings"}, export="none")
    report = inspect_model(f"{EXAMPLES / 'mlp.py'}:Net", None, options)
    assert not report.gradients.computed and not report.modes.computed
    rules = {f.rule for f in report.findings}
    assert not rules & {"gradients-failed", "train-mode-failure"}
    warned = [w for w in report.meta.warnings if "internal error of the inspector" in w]
    assert [w.split(":")[0] for w in warned] == ["gradients", "modes"]


@pytest.mark.slow
def test_hf_swin_gets_memory_gradients_and_modes_with_no_false_finding():
    from hf_tiny_models import SWIN_SPEC

    model = f"{Path(__file__).parent / 'hf_tiny_models.py'}:swin"
    real = inspect_model(model, SWIN_SPEC, Options(export="none"))
    fake = inspect_model(model, SWIN_SPEC, Options(fake=True, passes={"memory"}, export="none"))
    assert real.gradients.computed and real.modes.computed
    skipped = ("memory", "gradients", "modes")  # 'memory analysis skipped: ...' before
    assert not [w for w in real.meta.warnings + fake.meta.warnings if w.startswith(skipped)]
    assert not [f for f in real.findings if f.severity != "info"]
    measured = real.memory.measured
    assert abs(measured.saved_activation_error) < 0.01 and abs(measured.train_peak_error) < 0.02
    assert fake.memory.saved_activation_bytes == real.memory.saved_activation_bytes
    assert fake.memory.train_peak_bytes == real.memory.train_peak_bytes
