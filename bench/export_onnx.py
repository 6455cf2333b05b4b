"""What the ONNX target adds to the export pass, and how close onnxruntime is to eager.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/export_onnx.py

The export pass alone on each model, at `--export fast` (the default: non-strict export,
TorchScript script and trace) and `all` (adds strict export and ONNX), with the batch a
named dim B, so every target is also run at B/2 beside eager. Prints the pass's seconds at
each level, the ONNX target's own seconds and its share of `all`, and the largest
|onnxruntime - eager| over the sample and B/2.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples"))

import export_models  # noqa: E402
import resnet  # noqa: E402
import torch  # noqa: E402

from inspector.context import Context, InputFactory, Inputs, LoadedModel, Options  # noqa: E402
from inspector.passes import export  # noqa: E402
from inspector.report import Report  # noqa: E402


class Batched(InputFactory):
    """One input of `shape` whose first dim is the named dim B."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__({"B": shape[0]})
        self.shape = shape

    def build(self, dims: dict[str, int] | None = None, device: str = "cpu") -> Inputs:
        b = (dims or {}).get("B", self.dims["B"])
        return Inputs((torch.randn(b, *self.shape[1:]),), {}, dims={"B": b})


def export_pass(model: torch.nn.Module, shape: tuple[int, ...], level: str) -> tuple[float, dict]:
    factory = Batched(shape)
    loaded = LoadedModel(model, "python", "m.py", user_files=[])
    ctx = Context(loaded, factory, factory.build(), Options(export=level), Report())
    start = time.perf_counter()
    export.run(ctx)
    return time.perf_counter() - start, {t.target: t for t in ctx.report.export.targets}


MODELS = [
    ("Linear(8, 4) + ReLU (tests/export_models.py)", export_models.Clean, (8, 8)),
    ("ResNet-18 (examples/resnet.py), B=2, 3x64x64", resnet.resnet18, (2, 3, 64, 64)),
]


def main() -> None:
    torch.manual_seed(0)
    export_pass(export_models.Clean(), (8, 8), "all")  # the exporters' imports, once
    print("| model | fast s | all s | onnx s | onnx share of all | max abs diff onnx vs eager |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, make, shape in MODELS:
        fast, _ = export_pass(make(), shape, "fast")
        full, targets = export_pass(make(), shape, "all")
        onnx = targets["onnx"]
        if not onnx.ok:
            print(f"| {name} | {fast:.1f} | {full:.1f} | - | - | {onnx.error} |")
            continue
        share = onnx.seconds / full
        diff = f"{onnx.max_abs_diff:.2g} ({', '.join(onnx.checked)})"
        print(f"| {name} | {fast:.1f} | {full:.1f} | {onnx.seconds:.1f} | {share:.0%} | {diff} |")


if __name__ == "__main__":
    main()
