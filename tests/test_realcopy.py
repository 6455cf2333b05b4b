"""`--fake` on a model whose forward needs tensor values (a boolean mask, NMS): a small
model is analysed on a real copy, with every number; a big one stays fake and says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inspector import realcopy
from inspector.analyze import inspect_model
from inspector.context import Options
from inspector.errors import FakeModeLimit

# Rows are kept by a mask that keeps them all (a row's sum equals itself), so the size is
# known by hand but only a value can tell it: fake tensors raise on the boolean index.
MASKED = """
import torch
from torch import nn


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h = self.fc(x).relu()
        return self.head(h[h.sum(1) == h.sum(1)])


def example_inputs():
    return torch.randn(4, 8)
"""
# fc: 2 * 4 * 8 * 8 = 512; head: 2 * 4 * 8 * 2 = 128
FORWARD = 640
# fc: only its weight's gradient (x needs none): 512; head: weight 128 + input 128
BACKWARD = 768


def _source(tmp_path: Path) -> str:
    path = tmp_path / "masked.py"
    path.write_text(MASKED)
    return f"{path}:Masked"


def test_a_small_model_that_needs_values_runs_on_a_real_copy(tmp_path: Path) -> None:
    report = inspect_model(_source(tmp_path), None, Options(fake=True, passes={"graph"}))
    assert report.meta.fake is False and report.meta.options["fake"] is True
    note = next(w for w in report.meta.warnings if w.startswith("--fake:"))
    assert "needs tensor values" in note and "analysed for real instead" in note
    assert report.capture.method is not None
    assert (report.totals.flops_forward, report.totals.flops_backward) == (FORWARD, BACKWARD)
    shaped = {m.path: m.output_shapes for m in report.modules}
    assert shaped["head"] == [[4, 2]]
    # The same numbers as a run without --fake.
    real = inspect_model(_source(tmp_path), None, Options(passes={"graph"}))
    assert real.totals.flops_backward == BACKWARD
    assert not any("a backward could not run" in w for w in real.meta.warnings)


def test_a_big_model_that_needs_values_stays_fake_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(realcopy, "REAL_COPY_MAX_BYTES", 100)  # the model has 376 B
    with pytest.raises(FakeModeLimit) as raised:
        inspect_model(_source(tmp_path), None, Options(fake=True, passes={"graph"}))
    # torch's limit, not the user's code: what needs values, where, and what to do
    assert "--fake cannot run this model: aten.nonzero.default" in str(raised.value)
    assert "depends on tensor values" in str(raised.value)
    assert raised.value.location.endswith("masked.py:14")
    assert "Run without --fake" in raised.value.hint
    keep, note = realcopy.real_copy_decision(RuntimeError("x"), torch.nn.Linear(8, 8, bias=False))
    assert not keep and "at 256 B of weights (above 100 B) a real copy is not built" in note


def test_models_that_run_on_fake_tensors_are_not_copied(tmp_path: Path) -> None:
    path = tmp_path / "plain.py"
    path.write_text(MASKED.replace("h[h.sum(1) == h.sum(1)]", "h"))
    report = inspect_model(f"{path}:Masked", None, Options(fake=True, passes={"graph"}))
    assert report.meta.fake is True
    assert not any(w.startswith("--fake:") for w in report.meta.warnings)
    assert torch.is_grad_enabled()


@pytest.mark.slow
def test_a_torchvision_detector_under_fake_gets_its_graph_from_a_real_copy() -> None:
    """Faster R-CNN's NMS and box filters need values: before, `--fake` had no capture,
    0 FLOPs and 278 modules without shapes. FLOPs against FlopCounterMode on a real step."""
    pytest.importorskip("torchvision")
    import zoo_models
    from torch.utils.flop_counter import FlopCounterMode
    from zoo_compare import inspect_zoo

    name = "fasterrcnn_mobilenet_v3_large_320_fpn"
    report = inspect_zoo(name, fake=True, passes={"graph"})
    assert report.meta.fake is False and report.capture.method == "hooks"
    zoo = zoo_models.ZOO[name]
    torch.manual_seed(Options().seed)  # as the report's run: the boxes kept depend on values
    model = zoo.build()
    args, kwargs = zoo.inputs()
    counter = FlopCounterMode(display=False)
    with counter:
        losses = model(*args, **kwargs)  # train mode with targets: a dict of losses
        forward = counter.get_total_flops()
        sum(losses.values()).backward()
    assert report.totals.flops_forward == forward
    assert report.totals.flops_backward == counter.get_total_flops() - forward
    ran = {m.path for m in report.modules if m.type not in ("ModuleList", "ModuleDict")}
    assert ran == {m.path for m in report.modules if m.output_shapes}


# Only training branches on a value: each layer is skipped when a draw is under the rate,
# as wav2vec2's layerdrop does; the eval-mode check at load runs on fake tensors fine.
LAYERDROP = """
import torch
from torch import nn


class LayerDrop(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            if self.training and torch.rand([]) < 0.1:
                continue
            x = layer(x).relu()
        return x


def example_inputs():
    return torch.randn(8, 16)
"""


def test_a_branch_only_training_takes_on_a_value_gets_the_real_copy(tmp_path: Path) -> None:
    path = tmp_path / "layerdrop.py"
    path.write_text(LAYERDROP)
    options = Options(fake=True, passes={"graph", "memory"})
    report = inspect_model(f"{path}:LayerDrop", None, options)
    assert report.meta.fake is False
    assert any(w.startswith("--fake:") and "analysed for real" in w for w in report.meta.warnings)
    real = inspect_model(f"{path}:LayerDrop", None, Options(passes={"graph", "memory"}))
    # the same step as without --fake: before, memory was skipped under --fake
    assert report.memory.train_peak_bytes == real.memory.train_peak_bytes > 0
    assert report.memory.saved_activation_bytes == real.memory.saved_activation_bytes
