"""Benchmark: the memory pass's checkpoint runs against their bound (issue #17).

The pass makes a checkpoint run (a fake training step with blocks checkpointed) only where
its blocks could free the advice's share of the peak at most (inspector/memory/advice.py
`checkpoint_bound`). Here every run is made, whatever its bound, for each zoo model
(tests/zoo_models.py, their test sizes; one child process per model, the passes in it):
per run, the measured saving against the bound (it must never exceed it), and whether a
run left out would have been shown (it must never be). Printed: the runs, those left out
and their seconds against all runs' seconds.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/checkpoint_bound.py
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/checkpoint_bound.py --only googlenet
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
os.environ.setdefault("OMP_NUM_THREADS", "1")
HEAVY = {"vit_h_14", "vit_l_16", "vit_l_32"}  # minutes each and GBs of weights


def one_model(name: str) -> list[dict]:
    """Every checkpoint run of zoo model `name`, made whatever its bound."""
    sys.path[:0] = [str(ROOT / "tests")]
    import torch

    import inspector  # noqa: F401 - before torchvision: its C++ ops are replaced

    torch.set_num_threads(1)
    import zoo_models

    import inspector.forkmap as forkmap
    from inspector.analyze import inspect_model
    from inspector.context import Options
    from inspector.memory import advice, independent

    forkmap.FORK_WORTH_SECONDS = float("inf")  # every run here, timed alone
    rows: list[dict] = []
    bound, least, checked, plan = (
        advice.checkpoint_bound, advice.meaningful_bytes, independent._checked,
        independent.checkpoint_runs,
    )  # fmt: skip

    def every_run(savings, train):  # noqa: ANN001, ANN202
        advice.meaningful_bytes = lambda peak: 0
        try:
            return plan(savings, train)
        finally:
            advice.meaningful_bytes = least

    def timed(a, paths, on):  # noqa: ANN001, ANN202
        start = time.perf_counter()
        result = checked(a, paths, on)
        savings = independent._savings(a).value
        predicted = {path: s for s, path, _ in savings}
        rows.append({
            "on": on or "(every block)",
            "predicted": predicted[on] if on else sum(predicted.values()),
            "measured": result.saving_bytes,
            "bound": bound(a.train, paths),
            "least": least(a.train.peak_bytes),
            "seconds": time.perf_counter() - start,
        })  # fmt: skip
        return result

    independent.checkpoint_runs, independent._checked = every_run, timed
    with tempfile.TemporaryDirectory() as folder:
        source = zoo_models.entry_file(name, folder)
        options = Options(passes={"graph", "memory"}, measure=False, isolate=False)
        inspect_model(source, None, options)  # in this process: the rows are kept here
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated zoo names (default: all)")
    parser.add_argument("--model", help=argparse.SUPPRESS)  # the child's own model
    args = parser.parse_args()
    if args.model:
        print(json.dumps(one_model(args.model)))
        return 0
    import inspector  # noqa: F401 - before torchvision, which zoo_models imports

    sys.path.insert(0, str(ROOT / "tests"))
    import zoo_models

    names = args.only.split(",") if args.only else [n for n in zoo_models.ZOO if n not in HEAVY]
    runs = left = above = hidden = 0
    spent = saved = 0.0
    for name in names:
        cmd = [sys.executable, __file__, "--model", name]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if out.returncode:
            tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"{name:40s} failed: {tail[:160]}", flush=True)
            continue
        rows = json.loads(out.stdout.strip().splitlines()[-1])
        out_of = [r for r in rows if max(r["predicted"], r["bound"]) < r["least"]]
        for r in rows:
            if r["measured"] > r["bound"]:
                above += 1
                print(f"  ABOVE THE BOUND {name} {r['on']}: {r['measured']} > {r['bound']}")
        for r in out_of:
            if r["measured"] >= r["least"]:
                hidden += 1
                print(f"  WOULD BE SHOWN {name} {r['on']}: {r['measured']} >= {r['least']}")
        runs, left = runs + len(rows), left + len(out_of)
        spent += sum(r["seconds"] for r in rows)
        saved += sum(r["seconds"] for r in out_of)
        print(f"{name:40s} runs {len(rows):2d}, left out {len(out_of):2d}", flush=True)
    share = saved / spent if spent else 0.0
    print(
        f"{len(names)} models: {runs} checkpoint runs, {left} left out ({saved:.1f} s of "
        f"{spent:.1f} s: {share:.2f}); measured above the bound: {above}; left out but "
        f"shown had they run: {hidden}"
    )
    return 1 if above or hidden else 0


if __name__ == "__main__":
    sys.exit(main())
