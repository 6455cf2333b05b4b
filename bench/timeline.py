"""Benchmark: where a report's time goes, on a timeline. Every pass the line runs and
every pass a lane beside it computes (inspector/beside.py), with its start and end from
the report's start, its process and its CPU seconds; the report's wall time against three
of the model's real training steps measured in the same process (issue #17's budget, the
cold import aside), and the stages' CPU seconds summed: the work the report did, which on
two cores bounds its wall from below at about half of it (not counted: a forked worker's
own runs inside a stage, as the memory pass's `side_by_side`).

For one of bench/pipeline.py's cases or a zoo model (tests/zoo_models.py), warmed as the
service's zygote warms (bench/pipeline.py --warm), one thread, passes forked as the
service's jobs run them:

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/timeline.py resnet18 --reports 2
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/timeline.py vit_b_16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _timed(log: Path, start: list[float], name: str, fn: Any) -> Any:
    """`fn`, appending (name, pid, start, end, CPU seconds) to `log` as it returns: a
    forked lane's line reaches the same file."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            row = [name, os.getpid(), wall - start[0], time.perf_counter() - start[0]]
            with log.open("a") as f:
                f.write(json.dumps([*row, time.process_time() - cpu]) + "\n")

    return timed


def _instrument(log: Path, start: list[float]) -> None:
    import inspector.analyze as analyze
    import inspector.passes as passes

    for i, (name, run) in enumerate(passes.PASSES):
        passes.PASSES[i] = (name, _timed(log, start, name, run))
    for name, beside in list(passes.BESIDE.items()):
        compute = _timed(log, start, f"{name} (lane)", beside.compute)
        passes.BESIDE[name] = dataclasses.replace(beside, compute=compute)
    analyze._load = _timed(log, start, "load", analyze._load)
    analyze.capture_graph = _timed(log, start, "capture", analyze.capture_graph)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a bench/pipeline.py case or a zoo model's name")
    parser.add_argument("--reports", type=int, default=1, help="reports in a row")
    args = parser.parse_args()

    import torch

    import inspector  # noqa: F401 - before torchvision: its C++ ops are replaced

    torch.set_num_threads(1)
    from pipeline import case_source, training_step_seconds, warm_as_zygote

    from inspector.analyze import inspect_model
    from inspector.context import Options

    with tempfile.TemporaryDirectory() as folder:
        warm_as_zygote(Path(folder))
        source, spec = case_source(args.model, folder)
        step = training_step_seconds(source, spec or "", 3)
        print(f"{args.model}: one real training step {step:.3f} s (median of 3)")
        log, start = Path(folder) / "timeline.jsonl", [0.0]
        _instrument(log, start)
        for n in range(args.reports):
            log.write_text("")
            start[0] = time.perf_counter()
            inspect_model(source, spec, Options())
            wall = time.perf_counter() - start[0]
            rows = sorted((json.loads(line) for line in log.read_text().splitlines()), key=_at)
            pids = sorted({row[1] for row in rows})
            cpu_total = sum(row[4] for row in rows)
            print(
                f"report {n + 1}: {wall:.2f} s, {wall / (3 * step):.2f} of three steps; "
                f"CPU {cpu_total:.2f} s in the stages below"
            )
            for name, pid, begun, ended, cpu in rows:
                if ended - begun >= 0.005:
                    print(
                        f"  {name:18s} process {pids.index(pid)}  {begun:6.2f} - {ended:6.2f} s"
                        f"  ({ended - begun:5.2f} s, CPU {cpu:5.2f} s)"
                    )
    return 0


def _at(row: list) -> float:
    return row[2]


if __name__ == "__main__":
    sys.exit(main())
