"""Benchmark: a fake training step at a batch size the fake mode has not seen, with and
without the rules that answer ops at any size (inspector/fakerules.py), against the same
step from the cache (the sizes seen before).

For each torchvision model: a fake copy, one forward and backward at batch 1 (the
caches learn), then at batch 2 (new sizes: what the memory pass's run at twice the batch
and its first step of a model whose widths vary pay), then at batch 2 again (the cache).
The rules-off run is a fresh fake mode with the rules turned off, in the same process.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/fake_rules.py
"""

from __future__ import annotations

import argparse
import time

import torch

import inspector  # noqa: F401 - before torchvision: its C++ ops are replaced

# isort: split
import torchvision

from inspector.fakevalues import new_fake_mode
from inspector.memory.shadow import fake_shadow

MODELS = ("mobilenet_v3_small", "resnet18", "efficientnet_b0", "convnext_tiny")


def _step(model: torch.nn.Module, mode: object, batch: int) -> float:
    with mode:
        x = torch.empty(batch, 3, 224, 224)
        start = time.perf_counter()
        model(x).float().mean().backward()
        seconds = time.perf_counter() - start
        for p in model.parameters():
            p.grad = None
    return seconds


def one(name: str, rules: bool) -> tuple[float, float]:
    """(seconds at a new batch, seconds from the cache)."""
    torch.manual_seed(0)
    mode = new_fake_mode()
    if not rules:
        mode.rules.key = lambda *call: None
    model = fake_shadow(getattr(torchvision.models, name)(), mode)
    _step(model, mode, 1)
    return _step(model, mode, 2), _step(model, mode, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated torchvision model names")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = args.only.split(",") if args.only else MODELS
    print("| model | new batch, no rules s | new batch, rules s | cached s | no rules / rules |")
    print("|---|---|---|---|---|")
    for name in names:
        plain, cached = one(name, rules=False)
        ruled, _ = one(name, rules=True)
        print(f"| {name} | {plain:.3f} | {ruled:.3f} | {cached:.3f} | **{plain / ruled:.1f}x** |")


if __name__ == "__main__":
    main()
