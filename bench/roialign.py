"""roi_align without torchvision's C++ ops: `inspector/compat/roialign.py` against
torchvision's eager Python fallback, on a Faster R-CNN-sized call and a whole forward.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/roialign.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from inspector.compat import torchvision_ops  # noqa: E402 - imports inspector: the ops hook
from inspector.compat.roialign import roi_align_bags  # noqa: E402


def seconds(fn: object, *args: object) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        fn(*args)
    return time.perf_counter() - start


def main() -> None:
    import torchvision  # after inspector: its pure-PyTorch ops are in place

    torch.manual_seed(0)
    x = torch.randn(2, 256, 40, 40)
    xy = torch.rand(1000, 2) * 300
    boxes = torch.cat(
        [torch.randint(0, 2, (1000, 1)).float(), xy, xy + torch.rand(1000, 2) * 60 + 1], 1
    )
    call = (x, boxes, 0.125, 7, 7, 2, False)
    fallback = torchvision_ops.roi_align_fallback()
    print(
        f"one call, 1000 boxes x 256 channels, 7x7, 2x2 samples: fallback "
        f"{seconds(fallback, *call):.2f} s, embedding_bag {seconds(roi_align_bags, *call):.3f} s"
    )
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None
    ).eval()
    images = [torch.rand(3, 160, 160), torch.rand(3, 128, 160)]
    seconds(model, images)  # warm up
    bags = seconds(model, images)
    torchvision_ops._roi_align_eager = lambda: fallback  # the op's kernel on the fallback
    slow = seconds(model, images)
    print(
        f"Faster R-CNN eval forward (2 images): {slow:.2f} s with the fallback, "
        f"{bags:.2f} s with embedding_bag"
    )


if __name__ == "__main__":
    main()
