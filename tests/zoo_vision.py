"""torchvision (classification, segmentation, detection, video, optical flow) and timm
models of the zoo, random-init (`weights=None`, `pretrained=False`) at small sizes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Too large for a 2-core CPU sweep (hundreds of M params or minutes a step): --all only.
_HEAVY_TV = {
    "vit_h_14", "vit_l_16", "vit_l_32", "regnet_y_128gf", "regnet_y_32gf", "regnet_x_32gf",
    "regnet_y_16gf", "regnet_x_16gf", "efficientnet_b5", "efficientnet_b6", "efficientnet_b7",
    "efficientnet_v2_l", "efficientnet_v2_m", "convnext_large", "convnext_base", "swin_b",
    "swin_v2_b", "resnext101_64x4d", "resnext101_32x8d", "wide_resnet101_2", "vgg19_bn",
    "vgg19", "vgg16", "vgg16_bn", "vgg13", "vgg13_bn", "resnet152", "densenet201",
    "densenet161", "regnet_x_8gf", "regnet_y_8gf",
}  # fmt: skip
# One of each family first, so a partial sweep already covers the kinds.
FIRST_TV = [
    "resnet18", "mobilenet_v3_small", "vit_b_16", "alexnet", "vgg11_bn", "squeezenet1_1",
    "densenet121", "googlenet", "inception_v3", "mobilenet_v2", "mnasnet0_5",
    "shufflenet_v2_x0_5", "efficientnet_b0", "efficientnet_v2_s", "regnet_y_400mf",
    "regnet_x_400mf", "resnext50_32x4d", "wide_resnet50_2", "resnet50", "convnext_tiny",
    "swin_t", "swin_v2_t", "maxvit_t",
]  # fmt: skip
# Constructor arguments that make a model run at a small image size.
_TV_KWARGS: dict[str, dict[str, Any]] = {
    "inception_v3": {"aux_logits": False, "init_weights": True},
    "googlenet": {"aux_logits": False, "init_weights": True},
    "vit_b_16": {"image_size": 32},
    "vit_b_32": {"image_size": 64},
    "vit_l_16": {"image_size": 32},
    "vit_l_32": {"image_size": 64},
    "vit_h_14": {"image_size": 28},
}
_TV_SIZE = {"inception_v3": 80, "vit_b_16": 32, "vit_h_14": 28, "vit_l_16": 32, "maxvit_t": 224}
# At 80 px Inception's Mixed_7 blocks run on a 1x1 map: each BatchNorm there sees one value
# per image. With 2 images its 1/std blew the gradients of every layer before it up
# (~150 "exploding" verdicts); 8 images give the 8 values bn_min_values asks for.
_TV_BATCH = {"inception_v3": 8}


def _images(size: int, batch: int = 2) -> Callable[[], tuple[tuple, dict]]:
    return lambda: ((torch.randn(batch, 3, size, size),), {})


def _classification() -> list[dict[str, Any]]:
    from torchvision import models

    every = models.list_models(module=models)
    ordered = FIRST_TV + [n for n in every if n not in FIRST_TV]
    return [
        {
            "name": name,
            "kind": "classification",
            "build": _tv_builder(name),
            "inputs": _images(_TV_SIZE.get(name, 64), _TV_BATCH.get(name, 2)),
            "heavy": name in _HEAVY_TV or name == "maxvit_t",  # maxvit: 224 px only
        }
        for name in ordered
    ]


def _tv_builder(name: str, **extra: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from torchvision import models

        kwargs = {"weights": None, **_TV_KWARGS.get(name, {}), **extra}
        return models.get_model(name, **kwargs)

    return build


def _seg_loss(output: Any, inputs: Any) -> torch.Tensor:
    """Per-pixel cross-entropy on the 'out' map (labels made from the input's shape)."""
    logits = output["out"]
    labels = torch.zeros(logits.shape[0], *logits.shape[2:], dtype=torch.long)
    return torch.nn.functional.cross_entropy(logits, labels)


def _segmentation() -> list[dict[str, Any]]:
    names = ["fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"]
    out = [
        {
            "name": name,
            "kind": "segmentation",
            "build": _tv_builder(name, weights_backbone=None, num_classes=5),
            "inputs": _images(64),
            "loss_fn": _seg_loss,
        }
        for name in names
    ]
    out.append(
        {
            "name": "deeplabv3_resnet50",
            "kind": "segmentation",
            "build": _tv_builder("deeplabv3_resnet50", weights_backbone=None, num_classes=5),
            "inputs": _images(64),
            "note": "default loss: mean of every output tensor",
        }
    )
    return out


def _targets(count: int, with_masks: bool = False) -> list[dict[str, torch.Tensor]]:
    targets = []
    for _ in range(count):
        target = {
            "boxes": torch.tensor([[4.0, 6.0, 40.0, 50.0], [20.0, 10.0, 60.0, 30.0]]),
            "labels": torch.tensor([1, 2]),
        }
        if with_masks:
            target["masks"] = torch.zeros(2, 64, 64, dtype=torch.uint8)
        targets.append(target)
    return targets


def _detection_inputs(with_masks: bool = False, count: int = 2) -> Callable[[], tuple[tuple, dict]]:
    """Train mode: a list of `count` 3x64x64 images and their targets (two boxes each)."""

    def inputs() -> tuple[tuple, dict]:
        images = [torch.rand(3, 64, 64) for _ in range(count)]
        return (images, _targets(count, with_masks)), {}

    return inputs


def _detection() -> list[dict[str, Any]]:
    sizes = {"min_size": 64, "max_size": 64}
    specs = [
        ("fasterrcnn_mobilenet_v3_large_320_fpn", sizes, False),
        ("fasterrcnn_resnet50_fpn", sizes, False),
        ("maskrcnn_resnet50_fpn", sizes, True),
        ("retinanet_resnet50_fpn", sizes, False),
        # resizes to its fixed 320 px; its last extra block and head run on a 1x1 map, so
        # their BatchNorms see one value per image: 8 images give the 8 bn_min_values asks
        ("ssdlite320_mobilenet_v3_large", {}, False),
        ("ssd300_vgg16", {}, False),  # fixed 300 px
    ]
    return [
        {
            "name": name,
            "kind": "detection",
            "build": _tv_builder(name, weights_backbone=None, num_classes=3, **kwargs),
            "inputs": _detection_inputs(masks, count=8 if name.startswith("ssd") else 2),
            "heavy": name == "ssd300_vgg16",  # VGG-16 at 300 px
            "note": "train mode with targets; the output is the dict of losses",
        }
        for name, kwargs, masks in specs
    ]


def _video_and_flow() -> list[dict[str, Any]]:
    # (B, C, T, H, W): layer4 sees T 1 x 2 x 2, so a batch of 2 gives its BatchNorms the
    # 8 values per channel bn_min_values asks for
    clip = lambda: ((torch.randn(2, 3, 4, 32, 32),), {})  # noqa: E731
    videos = [
        {"name": n, "kind": "video", "build": _tv_builder(n), "inputs": clip}
        for n in ("r3d_18", "mc3_18", "r2plus1d_18")
    ]

    # RAFT's correlation pyramid needs 128 px; two refinement steps instead of 12.
    def frames() -> tuple[tuple, dict]:
        return (torch.randn(1, 3, 128, 128), torch.randn(1, 3, 128, 128)), {"num_flow_updates": 2}

    flow = {
        "name": "raft_small",
        "kind": "flow",
        "build": _tv_builder("raft_small"),
        "inputs": frames,
    }
    return [*videos, flow]


# timm families with unusual ops, at 64 px where the architecture allows (img_size given).
_TIMM: list[tuple[str, int, dict[str, Any]]] = [
    # attention biases, BatchNorm linear layers. Its BatchNorm1d head needs a batch of 8
    # (bn_min_values: at 2 every sample normalises to +-1 and no gradient passes), and 128 px
    # (at 64 px the last stage attends over 1 token: softmax of one key, zero gradient)
    ("levit_128s", 128, {"img_size": 128}),
    ("cait_xxs24_224", 32, {"img_size": 32}),  # layer scale, talking heads, class attention
    ("coat_lite_tiny", 64, {"img_size": 64}),  # conv relative position encodings
    ("efficientformer_l1", 224, {}),  # meta blocks, attention bias by index (224 px only)
    ("mobilevit_xxs", 64, {}),  # unfold/fold transformer on conv features
    ("convit_tiny", 64, {"img_size": 64}),  # gated positional self-attention
    ("gcvit_xxtiny", 64, {"img_size": 64}),  # global context attention
    ("convnext_atto", 64, {}),  # layer scale (gamma 1e-6)
    ("swin_tiny_patch4_window7_224", 56, {"img_size": 56}),  # shifted windows
    ("vit_tiny_patch16_224", 32, {"img_size": 32}),
    ("xcit_nano_12_p16_224", 64, {"img_size": 64}),  # cross-covariance attention
    ("deit_tiny_distilled_patch16_224", 32, {"img_size": 32}),  # two heads in train mode
    ("eca_nfnet_l0", 64, {}),  # scaled weight standardisation
    ("poolformerv2_s12", 64, {}),  # pooling token mixer
    ("mixer_s16_224", 32, {"img_size": 32}),  # MLP-Mixer
    ("pit_ti_224", 64, {"img_size": 64}),  # pooling-based ViT
    # reparameterisable branches summed (batch variance ~20x at init); timm's BatchNormAct2d,
    # which fx traces through: its trace once counted a batch on the real running stats
    ("mobileone_s0", 64, {}),
]


def _timm() -> list[dict[str, Any]]:
    return [
        {
            "name": "timm-" + name.split("_patch")[0].removesuffix("_224"),
            "kind": "timm",
            "build": _timm_builder(name, kwargs),
            "inputs": _images(size, 8 if name.startswith("levit") else 2),
        }
        for name, size, kwargs in _TIMM
    ]


def _timm_builder(name: str, kwargs: dict[str, Any]) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, **kwargs)

    return build


VISION_MODELS: list[dict[str, Any]] = [
    *_classification(),
    *_segmentation(),
    *_detection(),
    *_video_and_flow(),
    *_timm(),
]
