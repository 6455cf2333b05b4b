"""Detection models given images only: captured in eval mode (train mode needs targets), and
trained (memory, gradients) on targets synthesized from the model's own API."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from inspector.analyze import inspect_model
from inspector.context import Inputs, Options

NEEDS_TARGETS = """
import torch
from torch import nn


class Det(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())

    def forward(self, x, targets=None):
        y = self.body(x)
        if self.training and targets is None:
            raise AssertionError("targets should not be none when in training mode")
        return y


def example_inputs():
    return torch.randn(2, 3, 16, 16)
"""


def test_a_model_that_needs_targets_in_train_mode_is_captured_in_eval_mode(
    tmp_path: Path,
) -> None:
    path = tmp_path / "det.py"
    path.write_text(NEEDS_TARGETS)
    report = inspect_model(f"{path}:Det", None, Options(passes={"graph", "memory"}))
    assert report.capture.method == "fx" and report.capture.eval_mode
    tried = [(a.method, a.ok, a.eval_mode) for a in report.capture.attempts]
    assert tried[:3] == [("fx", False, False), ("export", False, False), ("hooks", False, False)]
    assert tried[3] == ("fx", True, True)
    # conv 3->8, 3x3, 16x16 -> 14x14: 2 * 2 * 8 * 14 * 14 * (3 * 3 * 3) = 169,344
    assert report.totals.flops_forward == 169_344
    warnings = " ".join(report.meta.warnings)
    assert "fails in train mode (AssertionError: targets should not be none" in warnings
    assert "captured in eval mode with fx" in warnings
    assert "training memory needs a forward that runs in train mode" in warnings
    assert report.memory.train_peak_bytes is None


HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None
needs_torchvision = pytest.mark.skipif(not HAS_TORCHVISION, reason="torchvision missing")


# Small sizes keep the test fast: 128-pixel images, 50 proposals, 32 sampled boxes.
SMALL = dict(
    weights=None, weights_backbone=None, min_size=128, max_size=128,
    rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=50, rpn_pre_nms_top_n_train=100,
    rpn_post_nms_top_n_train=50, box_batch_size_per_image=32, box_detections_per_img=10,
)  # fmt: skip


def _detector() -> torch.nn.Module:
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    return fasterrcnn_mobilenet_v3_large_320_fpn(**SMALL)


@needs_torchvision
def test_targets_are_synthesized_for_torchvision_detectors_only() -> None:
    from inspector.detection import synthesized_targets

    images = [torch.rand(3, 64, 80), torch.rand(3, 48, 64)]
    targets = synthesized_targets(_detector(), Inputs((images,), {}))
    assert targets is not None and len(targets) == 2
    # the centre half of a 64 x 80 image: x 20..60, y 16..48
    assert targets[0]["boxes"].tolist() == [[20.0, 16.0, 60.0, 48.0]]
    assert targets[0]["labels"].tolist() == [1]
    assert synthesized_targets(_detector(), Inputs((images, targets), {})) is None  # given
    assert synthesized_targets(torch.nn.Linear(2, 2), Inputs((images,), {})) is None


DETECTOR = f"""
import torch
import torchvision

SMALL = {SMALL!r}


def make():
    return torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(**SMALL)


def example_inputs():
    return ([torch.rand(3, 160, 160), torch.rand(3, 128, 160)],)
"""


@pytest.mark.slow
@needs_torchvision
def test_faster_rcnn_on_images_only_gets_flops_memory_and_gradients(tmp_path: Path) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    path = tmp_path / "frcnn.py"
    path.write_text(DETECTOR)
    options = Options(passes={"graph", "memory", "gradients"}, measure=False)
    report = inspect_model(f"{path}:make", None, options)
    assert report.capture.eval_mode and report.capture.method == "hooks"
    # the same eval forward (same seed, weights and images: the box head's FLOPs follow the
    # number of proposals NMS keeps), counted by torch's own FlopCounterMode
    torch.manual_seed(0)
    model = _detector().eval()
    images = [torch.rand(3, 160, 160), torch.rand(3, 128, 160)]  # as example_inputs()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(images)
    assert report.totals.flops_forward == counter.get_total_flops() > 0
    assert report.memory.train_peak_bytes and report.memory.saved_activation_bytes
    assert report.gradients.computed and report.gradients.loss_value is not None
    warnings = " ".join(report.meta.warnings)
    assert "memory: the training step ran with synthesized targets" in warnings
