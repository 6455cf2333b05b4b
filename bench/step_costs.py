"""Benchmark: the set-ups' step cost of the report's own optimizer, read from the memory
pass's tracked step (inspector/memory/independent.py `analysed_step_cost`), against the
fake step `setups.step_cost` makes for it (issue #17).

For each zoo model (tests/zoo_models.py, their test sizes; one child process per model,
the graph and memory passes in it) and each optimizer asked for: both figures, which must
be equal, and the seconds of the step no longer made.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/step_costs.py
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/step_costs.py \\
        --only resnet18,gru --optimizers adamw,momentum,sgd
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
HEAVY = {"vit_h_14", "vit_l_16", "vit_l_32"}  # minutes each and GBs of weights


def one_model(name: str, optimizers: list[str]) -> list[dict]:
    """Per optimizer: the analysis's figure, the fake step's, and that step's seconds."""
    sys.path[:0] = [str(ROOT / "tests")]
    import torch

    import inspector  # noqa: F401 - before torchvision: its C++ ops are replaced

    torch.set_num_threads(1)
    import zoo_models

    from inspector.analyze import inspect_model
    from inspector.context import Options
    from inspector.memory import independent, setups
    from inspector.memory.step import unique_tensors

    rows: list[dict] = []
    own = independent._step_costs

    def both(ctx, a):  # noqa: ANN001, ANN202
        known = independent.analysed_step_cost(a)
        trainable = [p for p in unique_tensors(a.model.parameters()) if p.requires_grad]
        start = time.perf_counter()
        made = setups.step_cost(a.opts.optimizer, trainable, a.opts.fake_mode)
        seconds = time.perf_counter() - start
        rows.append({
            "optimizer": a.opts.optimizer, "analysed": known.get(a.opts.optimizer),
            "made": list(made), "seconds": seconds,
        })  # fmt: skip
        return own(ctx, a)

    independent._step_costs = both
    with tempfile.TemporaryDirectory() as folder:
        source = zoo_models.entry_file(name, folder)
        for optimizer in optimizers:
            options = Options(
                passes={"graph", "memory"}, measure=False, isolate=False, optimizer=optimizer
            )
            inspect_model(source, None, options)  # in this process: the rows are kept here
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated zoo names (default: all)")
    parser.add_argument("--optimizers", default="adamw", help="comma-separated")
    parser.add_argument("--model", help=argparse.SUPPRESS)  # the child's own model
    args = parser.parse_args()
    optimizers = args.optimizers.split(",")
    if args.model:
        print(json.dumps(one_model(args.model, optimizers)))
        return 0
    import inspector  # noqa: F401 - before torchvision, which zoo_models imports

    sys.path.insert(0, str(ROOT / "tests"))
    import zoo_models
    from pipeline import json_child

    names = args.only.split(",") if args.only else [n for n in zoo_models.ZOO if n not in HEAVY]
    compared = differ = unread = 0
    spared = 0.0
    for name in names:
        try:
            rows = json_child([__file__, "--model", name, "--optimizers", args.optimizers])
        except subprocess.CalledProcessError as exc:
            tail = (exc.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"{name:40s} failed: {tail[:160]}", flush=True)
            continue
        for r in rows:
            if r["analysed"] is None:  # a real copy's step, or a step that skipped some
                unread += 1
                continue
            compared += 1
            spared += r["seconds"]
            if r["analysed"] != r["made"]:
                differ += 1
                print(f"  DIFFERENT {name} {r['optimizer']}: {r['analysed']} != {r['made']}")
        print(f"{name:40s} " + ", ".join(f"{r['optimizer']} {r['seconds']:.3f} s" for r in rows))
    print(
        f"{len(names)} models: {compared} step costs read from the analysis ({spared:.1f} s of "
        f"fake steps spared), {unread} made as before; different: {differ}"
    )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
