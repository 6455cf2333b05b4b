"""torchvision detection models in train mode: targets synthesized from the model's API.

Faster/Mask/Keypoint R-CNN, RetinaNet, FCOS and SSD refuse to run in train mode without
`targets` (one dict a image). Given images only, the capture falls back to eval mode
(capture.py); the passes that train (memory, gradients) run with one documented target a
image instead: a box over the image's centre half labelled 1 (a valid class of every
detector with 2+ classes), plus a mask filling that box (Mask R-CNN) and every keypoint at
its centre (Keypoint R-CNN). Inputs that bring `targets` are used as they are.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from inspector.context import Context, Inputs

__all__ = ["is_torchvision_detector", "synthesized_targets", "training_inputs", "TARGETS_NOTE"]

TARGETS_NOTE = (
    "{what}: the training step ran with synthesized targets (torchvision detectors need "
    "them in train mode): one box over each image's centre half, labelled 1{extra}. Give "
    "your own as the `targets` input (example_inputs() returning (images, targets)) for "
    "figures on real annotations."
)


def is_torchvision_detector(model: nn.Module) -> bool:
    """A torchvision detection model: its forward takes `targets`."""
    if not type(model).__module__.startswith("torchvision.models.detection"):
        return False
    try:
        return "targets" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def synthesized_targets(model: nn.Module, inputs: Inputs) -> list[dict[str, torch.Tensor]] | None:
    """One target a image for a detector given images only; None when not needed."""
    if not is_torchvision_detector(model) or "targets" in inputs.kwargs or len(inputs.args) != 1:
        return None
    images = inputs.args[0]
    if isinstance(images, torch.Tensor) and images.dim() == 4:
        images = list(images)
    if not isinstance(images, (list, tuple)) or not all(
        isinstance(i, torch.Tensor) and i.dim() == 3 for i in images
    ):
        return None
    return [_target(model, image) for image in images]


def _target(model: nn.Module, image: torch.Tensor) -> dict[str, torch.Tensor]:
    h, w = int(image.shape[-2]), int(image.shape[-1])
    x1, y1, x2, y2 = w // 4, h // 4, w - w // 4, h - h // 4
    device = image.device
    target = {
        "boxes": torch.tensor([[x1, y1, x2, y2]], dtype=torch.float32, device=device),
        "labels": torch.ones(1, dtype=torch.int64, device=device),
    }
    heads = getattr(model, "roi_heads", None)
    if heads is not None and heads.has_mask():
        mask = torch.zeros((1, h, w), dtype=torch.uint8, device=device)
        mask[:, y1:y2, x1:x2] = 1
        target["masks"] = mask
    if heads is not None and heads.has_keypoint():
        k = _keypoint_count(heads)
        point = torch.tensor([(x1 + x2) / 2, (y1 + y2) / 2, 1.0], device=device)
        target["keypoints"] = point.repeat(1, k, 1)
    return target


def _keypoint_count(heads: Any) -> int:
    return int(heads.keypoint_predictor.kps_score_lowres.out_channels)


def _extras(target: dict[str, torch.Tensor]) -> str:
    extra = ""
    if "masks" in target:
        extra += ", with a mask filling the box"
    if "keypoints" in target:
        extra += f", with its {target['keypoints'].shape[1]} keypoints at the box's centre"
    return extra


@contextmanager
def training_inputs(ctx: Context, what: str | None) -> Iterator[None]:
    """`ctx.inputs` with synthesized targets while the block runs, where the model needs
    them (the report says so, naming `what`; None: a pass that said it already, as the
    memory pass for its measurement); unchanged otherwise."""
    targets = synthesized_targets(ctx.model, ctx.inputs)
    if targets is None:
        yield
        return
    saved = ctx.inputs
    ctx.inputs = Inputs(saved.args, {**saved.kwargs, "targets": targets}, saved.dims)
    if what is not None:
        ctx.report.meta.warnings.append(TARGETS_NOTE.format(what=what, extra=_extras(targets[0])))
    try:
        yield
    finally:
        ctx.inputs = saved
