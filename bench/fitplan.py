"""Fit plans (`--fit BUDGET --batch B`) for GPT-2 small and ResNet-50: the plan, its
predicted against its verified peak, the extra compute predicted against counted, and
the time, all on fake tensors (no weights allocated).

    PYTHONPATH=. .venv/bin/python bench/fitplan.py            # GPT-2 small, ResNet-50
    PYTHONPATH=. .venv/bin/python bench/fitplan.py --quick    # a smaller batch for each
    PYTHONPATH=. .venv/bin/python bench/fitplan.py --case 5   # the sharded row only

GPT-2 small is built from its config (preset:gpt2, no hub download); ResNet-50 is the
project's preset with torchvision's layout and parameter count (25,557,032), since the
shared environment's torchvision build does not import beside torch 2.13+cpu.
The ratio column is predicted / verified: the prediction only orders the candidates, the
verified run (the real model with the changes, on fake tensors) decides what fits.
"""

from __future__ import annotations

import argparse
import time

from inspector.analyze import inspect_model
from inspector.context import Options
from inspector.units import format_bytes

GIB = 1024**3
# (label, model, input spec, budget, effective batch)
CASES = [
    ("GPT-2 small, S=1024", "preset:gpt2", '{"dims": {"B": 8, "S": 1024}}', 24 * GIB, 32),
    ("GPT-2 small, S=1024", "preset:gpt2", '{"dims": {"B": 8, "S": 1024}}', 16 * GIB, 32),
    # one sequence per step: no micro-batch to split, so checkpointing has to do it
    ("GPT-2 small, S=1024", "preset:gpt2", '{"dims": {"B": 1, "S": 1024}}', 3 * GIB, 1),
    ("ResNet-50, 224x224", "preset:resnet-50", '{"dims": {"B": 32}}', 8 * GIB, 256),
    ("ResNet-50, 224x224", "preset:resnet-50", '{"dims": {"B": 32}}', 2 * GIB, 256),
    # under bf16 parameters + SGD on one GPU (729 MB): FSDP, the cheapest plan on its GPUs
    ("GPT-2 small, S=256", "preset:gpt2", '{"dims": {"B": 8, "S": 256}}', int(0.675 * GIB), 32),
]
QUICK = [
    ("GPT-2 small, S=1024", "preset:gpt2", '{"dims": {"B": 2, "S": 1024}}', 6 * GIB, 8),
    ("ResNet-50, 224x224", "preset:resnet-50", '{"dims": {"B": 8}}', 2 * GIB, 64),
]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def row(label: str, model: str, spec: str, budget: int, batch: int) -> str:
    start = time.perf_counter()
    options = Options(fake=True, passes={"graph", "memory", "fitplan"}, fit_bytes=budget,
                      fit_batch=batch)  # fmt: skip
    report = inspect_model(model, spec, options)
    total = time.perf_counter() - start
    plan = report.memory.fit_plan
    changes = "; ".join(c.summary.split(":")[0] for c in plan.changes) or "none"
    if plan.gpus > 1:  # the micro-batch and accumulation a rank runs
        changes += f" [micro-batch {plan.micro_batch} x {plan.accumulation_steps} per rank]"
    ratio = (
        f"{plan.predicted_peak_bytes / plan.verified_peak_bytes:.3f}"
        if plan.predicted_peak_bytes and plan.verified_peak_bytes
        else "-"
    )
    verdict = "fits" if plan.found else "no plan"
    return (
        f"| {label} | {format_bytes(budget)} | {batch} | {format_bytes(plan.baseline_peak_bytes)}"
        f" | {verdict} | {changes} | {format_bytes(plan.predicted_peak_bytes)} | "
        f"{format_bytes(plan.verified_peak_bytes)} | {ratio} | "
        f"{_pct(plan.predicted_extra_compute)} / {_pct(plan.extra_compute)} | "
        f"{len(plan.tried)} | {plan.seconds:.1f} s | {total:.1f} s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller batches")
    parser.add_argument("--case", type=int, action="append", help="run only these rows (0-based)")
    args = parser.parse_args()
    print("| model | budget | batch | peak now | verdict | changes | predicted | verified | "
          "pred/ver | extra compute pred / counted | runs | fit time | total |")  # fmt: skip
    print("|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    cases = QUICK if args.quick else CASES
    for i in args.case or range(len(cases)):
        print(row(*cases[i]), flush=True)


if __name__ == "__main__":
    main()
