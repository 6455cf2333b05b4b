"""Benchmark: the measured step's optimizer phase, made of its allocations without its
arithmetic (inspector/memory/warmup.py `allocations_only`), against the same phase run
for real in another tree (issue #17).

For each zoo model (tests/zoo_models.py, their test sizes), in a fresh interpreter per
tree and model, loaded as the report loads it: the optimizer phase the measure lane runs
(inspector/memory/measure.py `measure_optimizer_phase`) for each optimizer, its seconds
and its figures, as the lane runs it after the load recorded the inference forward (the
default report on the CPU: an arbitrary peak given here) and with that forward run in the
phase (its values are read); with `--full`, the whole measured step too (`measure`: a
real forward and backward, then the optimizer). The figures of the two trees must be
equal to the byte, but for a forward whose peak depends on its inputs (a detector's, drawn
anew in each process: two runs of one tree differ too). Printed: each model's seconds
before and after and the ratio.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/optimizer_phase.py --before /tmp/base
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/optimizer_phase.py \
        --before /tmp/base --only vgg11_bn,vit_b_16 --full
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
HEAVY = {"vit_h_14", "vit_l_16", "vit_l_32"}  # GBs of weights: minutes each, for real
OPTIMIZERS = ("adamw", "momentum", "sgd")


def one_model(name: str, full: bool) -> dict:
    """{optimizer: (figures, seconds)} of zoo model `name`'s optimizer phase, with its
    inference forward under "forward <optimizer>" (and its whole measured step under
    "step <optimizer>", with `full`)."""
    sys.path[:0] = [str(ROOT / "tests")]
    import torch

    import inspector  # noqa: F401 - before torchvision: its C++ ops are replaced

    torch.set_num_threads(1)
    import zoo_models

    from inspector.inputspec import parse_input
    from inspector.loaders.load import load_model
    from inspector.memory.measure import measure, measure_optimizer_phase
    from inspector.memory.step import StepOptions

    out: dict[str, tuple[dict, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        loaded = load_model(zoo_models.entry_file(name, folder), device="cpu")
        inputs = parse_input(None, loaded).build(device="cpu")
        for optimizer in OPTIMIZERS:
            opts = StepOptions(optimizer=optimizer, loss_fn=loaded.loss_fn)
            runs = [
                # as the lane runs it where the load recorded the inference forward (on the
                # CPU without autocast: the default report), then where it did not
                ("", lambda o=opts: measure_optimizer_phase(loaded.model, inputs, o, 1 << 20)),
                ("forward ", lambda o=opts: measure_optimizer_phase(loaded.model, inputs, o)),
            ]
            if full:
                runs.append(("step ", lambda o=opts: measure(loaded.model, inputs, o)))
            for prefix, run in runs:
                start = time.perf_counter()
                figures = vars(run())
                seconds = time.perf_counter() - start
                kept = {k: v for k, v in figures.items() if "seconds" not in k}
                out[prefix + optimizer] = (kept, seconds)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a tree whose phase runs for real (required)")
    parser.add_argument("--only", default="", help="comma-separated zoo names (default: all)")
    parser.add_argument("--full", action="store_true", help="the whole measured step too")
    parser.add_argument("--model", help=argparse.SUPPRESS)  # the child's own model
    args = parser.parse_args()
    if args.model:
        print(json.dumps(one_model(args.model, args.full)))
        return 0
    if not args.before:
        parser.error("--before TREE is required")
    import inspector  # noqa: F401 - before torchvision, which zoo_models imports

    sys.path.insert(0, str(ROOT / "tests"))
    import zoo_models
    from pipeline import compared_trees, json_child

    names = args.only.split(",") if args.only else [n for n in zoo_models.ZOO if n not in HEAVY]
    differ, ratios = 0, []
    for name in names:
        child = [__file__, "--model", name] + (["--full"] if args.full else [])
        try:
            got = {label: json_child(child, tree) for label, tree in compared_trees(args.before)}
        except subprocess.CalledProcessError as exc:
            tail = (exc.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"{name:40s} failed: {tail[:160]}", flush=True)
            continue
        before, after = got["before"], got["after"]
        different = [key for key in before if before[key][0] != after[key][0]]
        for key in different:
            print(f"  DIFFERENT {name} {key}: {before[key][0]} != {after[key][0]}")
        differ += len(different)
        spent = {label: sum(s for _, s in runs.values()) for label, runs in got.items()}
        ratios.append(spent["after"] / spent["before"])
        print(
            f"{name:40s} {spent['before']:6.2f} s -> {spent['after']:6.2f} s "
            f"({ratios[-1]:.2f}), figures {'different' if different else 'equal'}",
            flush=True,
        )
    if ratios:
        print(
            f"{len(ratios)} models: after / before median {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}); figures different: {differ}"
        )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
