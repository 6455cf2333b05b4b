"""torchvision without its C++ ops: the pure-PyTorch nms and roi_align give torchvision's
answers, train, and keep the native kernel's memory (only the boxes saved for backward)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random

import pytest
import torch

from inspector.compat.torchvision_ops import nms_reference

if importlib.util.find_spec("torchvision") is None:
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError("torchvision is a test dependency: `make test` installs it")
    pytest.skip("torchvision is not installed", allow_module_level=True)

import torchvision  # noqa: E402
from torchvision.ops import batched_nms, nms, roi_align  # noqa: E402


def _iou(a: list[float], b: list[float]) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1])
    return inter / (area - inter)


def _greedy(boxes: list[list[float]], scores: list[float], thr: float) -> list[int]:
    """The textbook loop, written independently of the kernel under test."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    keep: list[int] = []
    for i in order:
        if all(_iou(boxes[i], boxes[k]) <= thr for k in keep):
            keep.append(i)
    return keep


def test_nms_by_hand() -> None:
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60.0]])
    # IoU(0, 1) = 9*9 / (100 + 100 - 81) = 0.68 > 0.5: box 1 goes; box 2 overlaps nothing.
    assert nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist() == [0, 2]
    assert nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.7).tolist() == [0, 1, 2]


def test_nms_matches_the_textbook_loop_on_random_boxes() -> None:
    rng = random.Random(0)
    for _ in range(20):
        xy = [[rng.uniform(0, 50), rng.uniform(0, 50)] for _ in range(60)]
        boxes = [[x, y, x + rng.uniform(1, 30), y + rng.uniform(1, 30)] for x, y in xy]
        scores = [rng.random() for _ in boxes]
        got = nms_reference(torch.tensor(boxes), torch.tensor(scores), 0.4).tolist()
        assert got == _greedy(boxes, scores, 0.4)


def test_batched_nms_keeps_classes_apart() -> None:
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11.0]])
    kept = batched_nms(boxes, torch.tensor([0.9, 0.8]), torch.tensor([0, 1]), 0.5)
    assert sorted(kept.tolist()) == [0, 1]  # same place, other class: both stay


def test_roi_align_samples_a_ramp_exactly() -> None:
    # x[..., h, w] = w. An 8x8 box in 4x4 bins is 2 px a bin; with 2 samples per bin side
    # (aligned=False) they sit at 2j + 0.5 and 2j + 1.5, so bin j averages to 2j + 1.
    x = torch.arange(16.0).repeat(16, 1).view(1, 1, 16, 16)
    out = roi_align(x, torch.tensor([[0, 0, 0, 8, 8.0]]), (4, 4), 1.0, 2, False)
    assert out[0, 0].tolist() == [[1.0, 3.0, 5.0, 7.0]] * 4


def test_roi_align_gradients_are_exact() -> None:
    x = torch.randn(2, 3, 12, 12, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[0, 1, 1, 9, 9], [1, 2, 3, 11, 10.0]], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: roi_align(t, rois, (3, 3), 0.5, 2, True), (x,))


def test_roi_align_saves_only_the_boxes_and_fakes_only_the_output() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(1, 8, 32, 32, requires_grad=True)
    rois = torch.tensor([[0, 0, 0, 16, 16.0]] * 10)
    saved: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t
    ):
        out = roi_align(x, rois, (7, 7), 1.0, 2, False)
    assert saved == [10 * 5 * 4]  # the [10, 5] float32 boxes, as the C++ op keeps
    out.sum().backward()
    with FakeTensorMode(allow_non_fake_inputs=True):
        fx = torch.empty(1, 8, 32, 32, requires_grad=True)
        fo = roi_align(fx, rois, (7, 7), 1.0, 2, False)
        fo.sum().backward()
        assert fo.shape == (10, 8, 7, 7) and fx.grad.shape == fx.shape


def test_a_detector_trains_and_predicts() -> None:
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3
    )
    target = {"boxes": torch.tensor([[10.0, 10, 100, 100]]), "labels": torch.tensor([1])}
    losses = model([torch.rand(3, 128, 128)], [target])
    sum(losses.values()).backward()
    assert model.roi_heads.box_head.fc6.weight.grad is not None
    model.eval()
    with torch.no_grad():
        (pred,) = model([torch.rand(3, 128, 128)])
    assert pred["boxes"].shape[1] == 4 and len(pred["boxes"]) == len(pred["scores"])


@pytest.mark.parametrize("sampling_ratio", [2, 0, -1])
@pytest.mark.parametrize("aligned", [False, True])
def test_roi_align_equals_torchvisions_python_fallback(sampling_ratio: int, aligned: bool) -> None:
    from inspector.compat.roialign import roi_align_bags
    from inspector.compat.torchvision_ops import roi_align_fallback

    gen = torch.Generator().manual_seed(sampling_ratio + 10 * aligned)
    x = torch.randn(2, 5, 13, 17, dtype=torch.float64, generator=gen)
    batch = torch.randint(0, 2, (40, 1), generator=gen).double()
    # boxes partly outside the map and some thinner than a pixel
    xy = torch.rand(40, 2, dtype=torch.float64, generator=gen) * 18 - 2
    wh = torch.rand(40, 2, dtype=torch.float64, generator=gen) * 14
    rois = torch.cat([batch, xy, xy + wh], 1)
    expected = roi_align_fallback()(x, rois, 0.8, 3, 4, sampling_ratio, aligned)
    got = roi_align_bags(x, rois, 0.8, 3, 4, sampling_ratio, aligned)
    assert got.shape == expected.shape == (40, 5, 3, 4)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)  # float64: the same sums


def test_roi_align_backward_equals_the_fallbacks_and_runs_under_a_dispatch_mode() -> None:
    # The memory tracker runs the training step under a TorchDispatchMode, where the op's
    # backward kernel runs with autograd off: it must not need autograd.
    from torch.utils._python_dispatch import TorchDispatchMode

    from inspector.compat.torchvision_ops import roi_align_fallback

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            return func(*args, **(kwargs or {}))

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 11, 9, dtype=torch.float64, generator=gen)
    rois = torch.tensor([[0, 1, 1, 8, 7], [1, 0.5, 2, 6, 10], [1, 3, 3, 3.2, 3.1]]).double()
    grad = torch.randn(3, 4, 3, 3, dtype=torch.float64, generator=gen)

    def input_grad(fn, mode=None) -> torch.Tensor:  # noqa: ANN001
        leaf = x.clone().requires_grad_(True)
        with mode or contextlib.nullcontext():
            fn(leaf, rois, (3, 3), 0.5, 0, True).backward(grad)
        return leaf.grad

    expected = input_grad(lambda t, r, size, s, ratio, a: roi_align_fallback()(
        t, r, s, size[0], size[1], ratio, a))  # fmt: skip
    torch.testing.assert_close(input_grad(roi_align), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(input_grad(roi_align, PassThrough()), expected, rtol=0, atol=1e-12)
