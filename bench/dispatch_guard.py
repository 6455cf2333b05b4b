"""Benchmark: the memory pass's tracked fake training step with our dispatch modes' hooks
under our own guard (inspector/dispatchmode.py) against the same hooks under torch's
dynamo-disable wrapper, which is what they had before.

In one process, per zoo model (tests/zoo_models.py): the modes' hooks are switched from
one guard to the other between steps, alternating which goes first, and each tracked
step (the model's fake copy, forward, loss, backward, AdamW step, under LiveTracker) is
timed in CPU seconds after one warm step. The machine's speed drifts by tens of percent
within a minute here, so only the paired ratios compare: **ours / torch's** per pair,
median over the pairs.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/dispatch_guard.py
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/dispatch_guard.py --only resnet18 \
        --pairs 12
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

import inspector  # noqa: E402, F401 - before torchvision: its C++ ops are replaced
from inspector.context import Inputs  # noqa: E402
from inspector.dispatchmode import lean_dispatch  # noqa: E402
from inspector.fakevalues import ValuedFakeTensorMode, new_fake_mode  # noqa: E402
from inspector.graph.metamemo import MetaMemo  # noqa: E402
from inspector.memory import warmup  # noqa: E402
from inspector.memory.shadow import fake_inputs, fake_shadow  # noqa: E402
from inspector.memory.step import StepOptions, train_step  # noqa: E402
from inspector.memory.tracker import LiveTracker  # noqa: E402

MODES = [
    LiveTracker,
    ValuedFakeTensorMode,
    MetaMemo,
    warmup._SkipInplace,
    warmup._SkipRealArithmetic,
]
DEFAULT = "timm-levit_128s,mobilenet_v3_small,resnet18,hf-bert"


def _guards() -> dict[str, dict[type, object]]:
    hooks = {mode: mode.__dict__["__torch_dispatch__"].__wrapped__ for mode in MODES}
    return {
        "torch": {
            mode: torch._disable_dynamo(hook, recursive=True) for mode, hook in hooks.items()
        },
        "ours": {mode: lean_dispatch(hook) for mode, hook in hooks.items()},
    }


def one_model(name: str, pairs: int) -> dict:
    import zoo_models

    zoo = zoo_models.ZOO[name]
    model = zoo.build()
    args, kwargs = zoo.inputs()
    inputs = Inputs(args=tuple(args), kwargs=dict(kwargs))

    def step() -> float:
        mode = new_fake_mode()
        shadow, fakes = fake_shadow(model, mode), fake_inputs(inputs, mode)
        options = StepOptions(optimizer="adamw", loss_fn=zoo.loss_fn, fake_mode=mode)
        train_step(shadow, fakes, options)  # warm: the fake mode's memo, the first dispatches
        shadow, fakes = fake_shadow(model, mode), fake_inputs(inputs, mode)
        start = time.process_time()
        train_step(shadow, fakes, options)
        return time.process_time() - start

    guards = _guards()
    seconds: dict[str, list[float]] = {"torch": [], "ours": []}
    for i in range(pairs):
        for guard in ("ours", "torch") if i % 2 else ("torch", "ours"):
            for mode, hook in guards[guard].items():
                mode.__torch_dispatch__ = hook
            seconds[guard].append(step())
    ratios = [o / t for o, t in zip(seconds["ours"], seconds["torch"], strict=True)]
    return {
        "name": name,
        "torch_ms": 1000 * statistics.median(seconds["torch"]),
        "ours_ms": 1000 * statistics.median(seconds["ours"]),
        "ratio": statistics.median(ratios),
        "spread": (min(ratios), max(ratios)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=DEFAULT, help="comma-separated zoo names")
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        "| model | torch's guard (ms CPU) | ours (ms CPU) | ours / torch's, per pair (median) "
        "| pairs' range |"
    )
    print("|---|---:|---:|---:|---|")
    for name in args.only.split(","):
        r = one_model(name, args.pairs)
        low, high = r["spread"]
        print(
            f"| {name} | {r['torch_ms']:.0f} | {r['ours_ms']:.0f} | **{r['ratio']:.3f}** | "
            f"{low:.2f}-{high:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
