"""Benchmark: a full default report against issue #17's budget across the zoo (the models
people bring, at the zoo's test sizes: tests/zoo_models.py), as bench/pipeline.py does for
its five cases.

For each model, in a fresh interpreter that first imports what a first analysis imports
(as the service's zygote does): one real AdamW training step of the model as the loader
builds it (its `example_inputs()`, its `loss_fn` or the report's default loss; one
warm-up, then the median of `--steps`), then `inspect_model` with the default options,
wall to wall. Budget: max(3 x step, 2 x a cold `import torch`, timed between models);
**report / budget** must be <= 1. Threads fixed to one, as in bench/pipeline.py.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/zoo_budget.py --count 20
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/zoo_budget.py --only resnet18,hf-gpt2
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
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipeline import cold_import_seconds, training_step_seconds, warm_as_zygote  # noqa: E402


def one_model(name: str, steps: int) -> dict:
    import torch

    import inspector  # noqa: F401 - before torchvision: its C++ ops are replaced

    torch.set_num_threads(1)
    import zoo_models

    from inspector.analyze import inspect_model
    from inspector.context import Options

    with tempfile.TemporaryDirectory() as folder:
        warm_as_zygote(Path(folder))
        source = zoo_models.entry_file(name, folder)
        step = training_step_seconds(source, "", steps)
        start = time.perf_counter()
        report = inspect_model(source, None, Options())
        wall = time.perf_counter() - start
    slowest = sorted(report.meta.timings_s.items(), key=lambda kv: -kv[1])[:3]
    return {
        "name": name,
        "kind": zoo_models.ZOO[name].kind,
        "nodes": len(report.nodes),
        "step_s": step,
        "report_s": wall,
        "slowest": ", ".join(f"{k} {v:.1f}" for k, v in slowest),
    }


def table(rows: list[dict]) -> str:
    head = "| model | kind | nodes | step s | budget s | report s | report / budget | slowest (s) |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | | | | | | | {r['error']} |")
            continue
        budget = max(3 * r["step_s"], 2 * r["import_s"])
        lines.append(
            f"| {r['name']} | {r['kind']} | {r['nodes']} | {r['step_s']:.3f} | {budget:.2f} | "
            f"{r['report_s']:.2f} | **{r['report_s'] / budget:.2f}** | {r['slowest']} |"
        )
    ratios = [
        r["report_s"] / max(3 * r["step_s"], 2 * r["import_s"]) for r in rows if "error" not in r
    ]
    if ratios:
        within = sum(x <= 1 for x in ratios)
        lines += [
            "",
            f"{within} of {len(ratios)} within the budget; report / budget median "
            f"{statistics.median(ratios):.2f}, largest {max(ratios):.2f}.",
        ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated zoo names")
    parser.add_argument("--count", type=int, help="the first N of the zoo (every kind first)")
    parser.add_argument("--steps", type=int, default=3, help="timed training steps (median)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per model")
    parser.add_argument("--model", help=argparse.SUPPRESS)  # the child's own model
    args = parser.parse_args()
    if args.model:
        print(json.dumps(one_model(args.model, args.steps)))
        return 0
    import inspector  # noqa: F401 - before torchvision (zoo_models imports it)

    # isort: split
    import zoo_models

    names = args.only.split(",") if args.only else zoo_models.names(heavy=False)
    names = names[: args.count] if args.count else names
    rows = []
    for name in names:
        cmd = [sys.executable, __file__, "--model", name, "--steps", str(args.steps)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=args.timeout
            )
            lines = done.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if done.returncode == 0 and lines else None
            if row is None:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:160]
                row = {"name": name, "error": tail}
        except subprocess.TimeoutExpired:
            row = {"name": name, "error": f"over {args.timeout} s"}
        row["import_s"] = cold_import_seconds()
        rows.append(row)
        print(f"{name}: {row}", file=sys.stderr)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
