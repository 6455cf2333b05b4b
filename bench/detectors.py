"""Faster R-CNN (torchvision, random init) given images only: the inspector's forward FLOPs
against torch's FlopCounterMode on the same eval forward, memory and gradients on the
synthesized targets, and the time of each stage; real and --fake.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/detectors.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import inspector  # noqa: E402,F401 - torchvision's pure-PyTorch ops, before torchvision
from inspector.analyze import inspect_model  # noqa: E402
from inspector.context import Options  # noqa: E402

MODEL = """
import torch
import torchvision


def make():
    return torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None
    )


def example_inputs():
    return ([torch.rand(3, 160, 160), torch.rand(3, 128, 160)],)
"""


def counted_flops(module: object) -> int:
    """FlopCounterMode on the eval forward the inspector captured: same seed, same order."""
    torch.manual_seed(0)
    model = module.make().eval()
    (images,) = module.example_inputs()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(images)
    return counter.get_total_flops()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "frcnn.py"
        path.write_text(MODEL)
        sys.path.insert(0, tmp)
        import frcnn  # noqa: PLC0415

        reference = counted_flops(frcnn)
        for fake in (False, True):
            start = time.perf_counter()
            r = inspect_model(f"{path}:make", None, Options(fake=fake, measure=False))
            took = time.perf_counter() - start
            print(
                f"fake={fake}: {took:.1f} s, capture {r.capture.method} "
                f"(eval mode: {r.capture.eval_mode}), failed passes {r.meta.failed_passes}"
            )
            print(
                f"  flops_forward {r.totals.flops_forward:,} vs FlopCounterMode "
                f"{reference:,}: ratio {r.totals.flops_forward / reference:.6f}"
            )
            print(
                f"  train_peak_bytes {r.memory.train_peak_bytes}, saved "
                f"{r.memory.saved_activation_bytes}, gradients {r.gradients.computed}"
            )
            print(f"  timings {r.meta.timings_s}")


if __name__ == "__main__":
    main()
