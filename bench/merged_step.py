"""Benchmark: the measured step merged into the gradients pass (inspector/memory/merged.py)
against the separate measured step, in the same run: the same figures (forward peak,
saved activations, training peak), and where the gradients pass's forward and backward
were not the step's, why (the separate step ran in their place).

For each model, in a fresh interpreter: `inspect_model` with the default options, passes
in this process (no forks), once merged (wherever its conditions hold, real runs the dear
ones or not) and once with the merge turned off; the measured
figures of both, and what the merged report's gradients pass said of its recording.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/merged_step.py
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/merged_step.py \
        --only resnet18,timm-levit_128s,hf-bert,vit_b_16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("OMP_NUM_THREADS", "1")

RESNET = (
    "examples/resnet.py:resnet18",
    '{"x": {"shape": ["B", 3, 224, 224]}, "dims": {"B": 8}}',
)
DEFAULT = "resnet18,timm-levit_128s,hf-bert,gru,vit_b_16,mobilenet_v3_small,custom-fn"


def one_model(name: str) -> dict:
    import torch

    import inspector  # noqa: F401 - before torchvision: its C++ ops are replaced

    torch.set_num_threads(1)
    from inspector.analyze import inspect_model
    from inspector.context import Options
    from inspector.memory import merged
    from inspector.passes import gradients

    said: list[str | None] = []
    step_measured = gradients._step_measured

    def spy(ctx, step, result) -> None:  # noqa: ANN001
        step_measured(ctx, step, result)
        said.append(step.refused)

    gradients._step_measured = spy
    planned = merged.planned
    with tempfile.TemporaryDirectory() as folder:
        if name == "resnet18":
            source, spec = RESNET
        else:
            sys.path.insert(0, str(ROOT / "tests"))
            import zoo_models

            source, spec = zoo_models.entry_file(name, folder), None
        figures = {}
        for way in ("merged", "separate"):
            # planned wherever the conditions hold, fake runs dear or not: the check
            merged._real_runs_dear = lambda ctx: True
            merged.planned = planned if way == "merged" else (lambda ctx: False)
            m = inspect_model(source, spec, Options(isolate=False)).memory.measured
            figures[way] = (
                None
                if m is None
                else [m.forward_peak_bytes, m.saved_activation_bytes, m.train_peak_bytes]
            )
    recorded = "not planned" if not said else (said[0] or "the step's")
    return {"name": name, **figures, "recorded": recorded}


def table(rows: list[dict]) -> str:
    lines = [
        "| model | forward peak B | saved B | training peak B | merged = separate "
        "| the gradients pass's forward and backward |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['error']} | | | | |")
            continue
        m, s = r["merged"], r["separate"]
        shown = m or s or [None] * 3
        cells = " | ".join("" if v is None else f"{v:,}" for v in shown)
        same = "yes" if m == s else f"**no**: separate {s}"
        lines.append(f"| {r['name']} | {cells} | {same} | {r['recorded']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=DEFAULT, help="resnet18 and/or zoo names")
    parser.add_argument("--model", help=argparse.SUPPRESS)  # the child's own model
    args = parser.parse_args()
    if args.model:
        print(json.dumps(one_model(args.model)))
        return 0
    rows = []
    for name in args.only.split(","):
        cmd = [sys.executable, __file__, "--model", name]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        lines = done.stdout.strip().splitlines()
        if done.returncode == 0 and lines:
            rows.append(json.loads(lines[-1]))
        else:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:160]
            rows.append({"name": name, "error": tail})
        print(f"{name}: {rows[-1]}", file=sys.stderr)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
