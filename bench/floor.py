"""Benchmark: the least a default report can cost on this machine, from torch's own work
alone, against the budget of issue #17 (max(3 x one training step, 2 x a cold
`import torch`)).

A default report runs, for real or on fake tensors, work that torch does and we only
call. Each piece is timed here with torch alone (no inspector code in the timed calls;
the model and inputs are built by the inspector's loader and input spec, as the report
builds them), the second call after a warm-up, one thread:
- `fit`: the inputs-fit check, one eval forward without grad (the measured inference
  forward too: the measure pass reads the one the load recorded);
- `gradients`: one forward and backward (gradient flow, per-node numerics; the measured
  training step's too, where they are merged: the measured optimizer step on the CPU
  makes its allocations only, inspector/memory/warmup.py, so it is left out);
- `export`: `torch.export.export` (non-strict, the batch dim dynamic where the inputs
  name it, else static, as the report exports), `.module()`, and one run of the program
  at the sample;
- `compile`: Dynamo's trace, `torch.compile(backend="eager")`'s first call less one eval
  forward;
- `memory`: two training steps on torch's plain FakeTensorMode (its dispatch cache
  emptied first, as for every fake piece), at the batch and at twice it (the least a
  batch-scaling estimate runs; the report runs more: the advice's verification runs,
  the per-node forward); one step where the inputs name no batch dim (a zoo model's
  `example_inputs()`).
A piece torch cannot run alone on the model (a detector's training step needs its
targets, its fake step the values NMS reads) is left out ("-"). Left out, so the floor
is low: loading, the graph pass, the statistics over every activation, the advice's
runs, the exported program at the changed dims, every cost of our own. The floor is the
pieces' sum spread over the machine's cores, and at least the longest piece;
`floor / budget` above 1 means no report of this scope fits the budget here, however
its passes are arranged.

A case is one of bench/pipeline.py's or a zoo model (tests/zoo_models.py, at its test
size, built by its `example_inputs()`):

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/floor.py
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/floor.py --only resnet18,deep
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/floor.py --only mobilenet_v3_small
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipeline import CASES, case_source, cold_import_seconds, training_step_seconds  # noqa: E402

PIECES = ("fit", "gradients", "export", "compile", "memory")


def _second(fn: Any) -> float:
    """Seconds of the second call (the first warms lazy imports), with the fake tensors'
    dispatch cache emptied: a report's runs cannot find their model's ops there."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fn()
    FakeTensorMode.cache_clear()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _doubled(spec: str) -> str | None:
    """The spec at twice its batch; None where it names no batch dim."""
    data = json.loads(spec) if spec else {}
    dims = data.get("dims", {})
    if "B" not in dims:
        return None
    dims["B"] *= 2
    return json.dumps(data)


def _alone(fn: Any) -> float | None:
    """`_second(fn)`, None where torch cannot run the piece on this model alone."""
    try:
        return _second(fn)
    except Exception as exc:  # noqa: BLE001 - the table says the piece is left out
        print(f"piece left out: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        return None


def pieces(model_ref: str, spec: str) -> dict[str, float | None]:
    """Each piece's seconds for one case (see the module's docstring)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from inspector.health.outputs import make_loss
    from inspector.inputspec import parse_input
    from inspector.loaders.load import load_model
    from inspector.memory.shadow import fake_inputs

    torch.set_num_threads(1)
    loaded = load_model(model_ref)
    model = loaded.model
    inputs = parse_input(spec, loaded).build()
    args, kwargs = tuple(inputs.args), dict(inputs.kwargs)

    def forward() -> None:
        model.eval()
        with torch.no_grad():
            model(*args, **kwargs)

    def loss(batch: Any) -> Any:  # the report's loss, as the timed training step's
        return make_loss(batch.call(model), batch, loaded.loss_fn)[0]

    def forward_backward() -> None:
        model.train()
        loss(inputs).backward()
        model.zero_grad(set_to_none=True)

    doubled = _doubled(spec)
    out: dict[str, float | None] = {"fit": _second(forward)}
    out["gradients"] = _alone(forward_backward)

    def export() -> None:
        model.eval()
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        shapes = tuple({0: torch.export.Dim.AUTO} if a.dim() else {} for a in tensors)
        # static where the inputs name no dim to change, as the report exports them
        named = doubled is not None and len(tensors) == len(args) and not kwargs
        shapes = shapes if named else None
        program = torch.export.export(model, args, kwargs, strict=False, dynamic_shapes=shapes)
        with torch.no_grad():
            program.module()(*args, **kwargs)

    out["export"] = _alone(export)

    def dynamo() -> None:
        torch._dynamo.reset()
        model.eval()
        with torch.no_grad():
            torch.compile(model, backend="eager")(*args, **kwargs)

    traced = _alone(dynamo)
    out["compile"] = None if traced is None else max(traced - out["fit"], 0.0)
    batches = [inputs] + ([parse_input(doubled, loaded).build()] if doubled else [])

    def fake_steps() -> None:
        for batch in batches:
            mode = FakeTensorMode(allow_non_fake_inputs=False)
            state = {
                name: mode.from_tensor(t)
                for name, t in (*model.named_parameters(), *model.named_buffers())
            }
            fake = fake_inputs(batch, mode)
            with mode:
                model.train()
                output = torch.func.functional_call(model, state, tuple(fake.args), fake.kwargs)
                make_loss(output, fake, loaded.loss_fn)[0].backward()

    out["memory"] = _alone(fake_steps)
    return out


def one_case(name: str, steps: int) -> dict:
    """A bench/pipeline.py case, or a zoo model at its test size."""
    with tempfile.TemporaryDirectory() as folder:
        model_ref, spec = case_source(name, folder)
        step = training_step_seconds(model_ref, spec or "", steps)
        return {"case": name, "step_s": step, "pieces": pieces(model_ref, spec or "")}


def table(rows: list[dict], cores: int) -> str:
    head = "| case | step s | cold import s | budget s | " + " | ".join(PIECES)
    head += " | floor s | floor / budget |"
    lines = [head, "|" + "---|" * (len(PIECES) + 6)]
    for r in rows:
        budget = max(3 * r["step_s"], 2 * r["import_s"])
        p = {k: v for k, v in r["pieces"].items() if v is not None}
        floor = max(sum(p.values()) / cores, max(p.values()))
        cells = " | ".join("-" if k not in p else f"{p[k]:.2f}" for k in PIECES)
        lines.append(
            f"| {r['case']} | {r['step_s']:.3f} | {r['import_s']:.2f} | {budget:.2f} | "
            f"{cells} | {floor:.2f} | **{floor / budget:.2f}** |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", help="comma-separated cases (" + ",".join(CASES) + ") or zoo models"
    )
    parser.add_argument("--steps", type=int, default=3, help="timed training steps (median)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # the child's own case
    args = parser.parse_args()
    if args.case:
        print(json.dumps(one_case(args.case, args.steps)))
        return 0
    cores = len(os.sched_getaffinity(0))
    rows = []
    for name in args.only.split(",") if args.only else ["mlp", "unet", "resnet18", "deep"]:
        cmd = [sys.executable, __file__, "--case", name, "--steps", str(args.steps)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, env=env)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["import_s"] = cold_import_seconds()
        rows.append(row)
        print(f"{name}: floor pieces {row['pieces']}", file=sys.stderr)
    print(f"\n{cores} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}\n")
    print(table(rows, cores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
