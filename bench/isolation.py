"""Cost of running the passes in forked children (inspector/isolation.py) against running
them in one process, on the same model and inputs in the same process.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/isolation.py [--repeat N]

Reports the passes' wall time (load and capture are the same either way) per model: in
one process, forked, and the difference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inspector.analyze import inspect_model  # noqa: E402
from inspector.context import Options  # noqa: E402

STAGES = ("load", "capture")
RESNET_B2 = '{"x": {"shape": [2, 3, 224, 224]}}'
CASES = [  # (label, model, input spec, fake)
    ("MLP (examples/mlp.py), real", "examples/mlp.py:Net", None, False),
    ("ResNet-18 B=2, fake", "examples/resnet.py:resnet18", RESNET_B2, True),
    ("ResNet-18 B=2, real", "examples/resnet.py:resnet18", RESNET_B2, False),
]


def passes_seconds(model: str, spec: str | None, fake: bool, isolate: bool) -> float:
    """Wall seconds of the passes stage."""
    start = time.perf_counter()
    report = inspect_model(str(ROOT / model), spec, Options(fake=fake, isolate=isolate))
    total = time.perf_counter() - start
    return total - sum(v for k, v in report.meta.timings_s.items() if k in STAGES)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| model | passes, one process | passes, forked | overhead |")
    print("|---|---|---|---|")
    for label, model, spec, fake in CASES:
        passes_seconds(model, spec, fake, False)  # warm: imports, caches
        one, forked = [], []
        for _ in range(args.repeat):  # interleaved: the machine's load hits both alike
            one.append(passes_seconds(model, spec, fake, False))
            forked.append(passes_seconds(model, spec, fake, True))
        a, b = statistics.median(one), statistics.median(forked)
        print(f"| {label} | {a:.3f} s | {b:.3f} s | {b - a:+.3f} s ({(b - a) / a:+.1%}) |")


if __name__ == "__main__":
    main()
