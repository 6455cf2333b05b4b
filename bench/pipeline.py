"""Benchmark: a full default report against one real training step of the same model at
the same batch, and against a cold `python -c "import torch"` (issue #17, item 1).

For each case, in a fresh interpreter (so no case warms another's caches):
1. one real training step: the model and inputs built by the inspector's own loader and
   input spec, forward, the report's default loss, backward, AdamW step; one warm-up,
   then the median of `--steps`;
2. `inspect_model` with the default options (what `inspector inspect MODEL --input SPEC`
   runs), timed wall to wall, and its `meta.timings_s` per stage.
A cold `import torch` is timed in between cases (median of 3). The target is
report <= max(3 x step, 2 x cold import); the ratio printed is report / that budget.

With `--warm`, each case first imports what a first analysis imports, as the service's
zygote does before it forks a job (inspector/zygote/warmup.py): the report then costs
what it costs a job, without the one-time lazy imports (fx's first trace alone pulls in
torch.export, AOTAutograd and networkx) that a first `inspector inspect` pays.

Threads are fixed to one (OMP_NUM_THREADS=1, torch.set_num_threads(1)) for the step and
the report alike: the machine is shared, and ratios from the same process and minute are
what compare. With one thread the passes run in forked children (inspector/isolation.py),
as the service's jobs do.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/pipeline.py
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/pipeline.py --only mlp,deep --save /tmp/r
    git archive main | tar -x -C /tmp/main    # then, before and after in one run:
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/pipeline.py --before /tmp/main
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/pipeline.py --warm
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("OMP_NUM_THREADS", "1")

_B = '"dims": {"B": %d}'
CASES: dict[str, tuple[str, str]] = {
    "resnet18": (
        "examples/resnet.py:resnet18",
        '{"x": {"shape": ["B", 3, 224, 224]}, ' + _B % 8 + "}",
    ),
    "gpt2": (
        "examples/gpt2.py:gpt2",
        '{"input_ids": {"shape": ["B", "S"], "dtype": "int64", "high": 50257}, '
        '"dims": {"B": 4, "S": 512}}',
    ),
    "unet": (
        "tests/test_gradient_verdicts.py:UNet",
        '{"x": {"shape": ["B", 3, 32, 32]}, ' + _B % 4 + "}",
    ),
    "mlp": ("examples/mlp.py:Net", '{"x": {"shape": ["B", 784]}, ' + _B % 64 + "}"),
    "deep": ("bench/deep.py:deep_stack", '{"x": {"shape": ["B", 32]}, ' + _B % 16 + "}"),
}


def case_source(name: str, folder: str) -> tuple[str, str | None]:
    """(model reference, input spec) of one of CASES, or of a zoo model (tests/
    zoo_models.py, on the path) written into `folder`, its spec None: its
    `example_inputs()` at its test size."""
    if name in CASES:
        return CASES[name]
    import inspector  # noqa: F401 - before torchvision (zoo_models imports it)

    # isort: split
    import zoo_models

    return zoo_models.entry_file(name, folder), None


def training_step_seconds(model_ref: str, spec: str, steps: int) -> float:
    """Median seconds of one real AdamW step (forward, default loss, backward, step)."""
    import torch

    from inspector.health.outputs import make_loss
    from inspector.inputspec import parse_input
    from inspector.loaders.load import load_model

    loaded = load_model(model_ref)
    inputs = parse_input(spec, loaded).build()
    model = loaded.model.train()
    opt = torch.optim.AdamW(model.parameters())
    times = []
    for _ in range(steps + 1):  # the first is the warm-up
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss, _ = make_loss(inputs.call(model), inputs, loaded.loss_fn)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def warm_as_zygote(folder: Path) -> None:
    """What the service's zygote does before it forks a job: import what a first analysis
    imports (learned in a child, in `folder`), and fill the caches it fills, where the
    tree has them (not one from before them, given with --before)."""
    from inspector.zygote import warmup

    warmup.import_all(warmup.learned_imports(folder))
    if hasattr(warmup, "warm_caches"):
        warmup.warm_caches()


def one_case(name: str, steps: int, save: str | None, warm: bool = False) -> dict:
    import torch

    torch.set_num_threads(1)
    from inspector.analyze import inspect_model
    from inspector.context import Options

    if warm:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            warm_as_zygote(Path(folder))

    model_ref, spec = CASES[name]
    step = training_step_seconds(model_ref, spec, steps)
    start = time.perf_counter()
    report = inspect_model(model_ref, spec, Options())
    wall = time.perf_counter() - start
    if save:
        Path(save, f"{name}.json").write_text(report.to_json())
    return {
        "case": name,
        "step_s": step,
        "report_s": wall,
        "nodes": len(report.nodes),
        "timings_s": report.meta.timings_s,
    }


def cold_import_seconds(runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_child(
    name: str, steps: int, save: str | None, code: str | None = None, warm: bool = False
) -> dict:
    """One case in a fresh interpreter; `code`: the inspector package from that tree (the
    models still from this one)."""
    args = [__file__, "--case", name, "--steps", str(steps)]
    args += ["--save", save] if save else []
    args += ["--warm"] if warm else []
    return json_child(args, code)


def compared_trees(before: str | None) -> list[tuple[str, Path]]:
    """("before", TREE) when given, then ("after", this tree): the trees a bench alternates."""
    trees = [("after", ROOT)]
    if before:
        trees.insert(0, ("before", Path(before).resolve()))
    return trees


def json_child(args: list[str], tree: str | Path | None = None) -> Any:
    """What a bench script run as `python ARGS` in a fresh interpreter prints as JSON on
    its last line; `tree`: the inspector package from that tree (the models and benches
    still from this one)."""
    env = {**os.environ, "PYTHONPATH": str(tree or ROOT)}
    cmd = [sys.executable, *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    stages = sorted({s for r in rows for s in r["timings_s"]}, key=_stage_order)
    head = "| case | nodes | step s | cold import s | report s | report / step | report / budget |"
    lines = [head, "|" + "---|" * 7]
    for r in rows:
        budget = max(3 * r["step_s"], 2 * r["import_s"])
        lines.append(
            f"| {r['label']} | {r['nodes']} | {r['step_s']:.3f} | {r['import_s']:.2f} | "
            f"{r['report_s']:.2f} | {r['report_s'] / r['step_s']:.1f}x | "
            f"**{r['report_s'] / budget:.2f}** |"
        )
    lines += ["", "| case | " + " | ".join(stages) + " |", "|" + "---|" * (len(stages) + 1)]
    for r in rows:
        cells = [f"{r['timings_s'].get(s, 0):.2f}" for s in stages]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _stage_order(stage: str) -> int:
    from inspector.passes import PASSES

    order = ["load", "capture", *[name for name, _ in PASSES]]
    return order.index(stage) if stage in order else len(order)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated cases: " + ",".join(CASES))
    parser.add_argument("--steps", type=int, default=3, help="timed training steps (median)")
    parser.add_argument("--save", metavar="DIR", help="write each report's JSON there")
    parser.add_argument(
        "--before",
        metavar="TREE",
        help="also run each case with the inspector package of TREE (e.g. `git archive` of "
        "main unpacked there), interleaved; its reports go to DIR/before with --save",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="import first what a first analysis imports, as the service's zygote does",
    )
    parser.add_argument("--case", help=argparse.SUPPRESS)  # the child's own case
    args = parser.parse_args()
    if args.case:
        print(json.dumps(one_case(args.case, args.steps, args.save, args.warm)))
        return 0
    trees = [("", None, args.save)]
    if args.before:
        before_dir = str(Path(args.save, "before")) if args.save else None
        trees.insert(0, ("before", str(Path(args.before).resolve()), before_dir))
    for _, _, save in trees:
        if save:
            Path(save).mkdir(parents=True, exist_ok=True)
    names = args.only.split(",") if args.only else list(CASES)
    rows = []
    for name in names:
        for tag, code, save in trees:
            row = run_child(name, args.steps, save, code, args.warm)
            row["import_s"] = cold_import_seconds()
            row["label"] = f"{name} ({tag})" if tag else name
            rows.append(row)
            print(
                f"{row['label']}: report {row['report_s']:.2f} s, step {row['step_s']:.3f} s",
                flush=True,
            )
    warmth = ", imports warm (as the zygote's)" if args.warm else ""
    print(f"\nload average {os.getloadavg()[0]:.1f}, OMP_NUM_THREADS=1{warmth}\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
