"""Benchmark: the least a default report can cost on this machine, from torch's own work
alone, against the budget of issue #17 (max(3 x one training step, 2 x a cold
`import torch`)).

A default report runs, for real or on fake tensors, work that torch does and we only
call. Each piece is timed here with torch alone (no inspector code in the timed calls;
the model and inputs are built by the inspector's loader and input spec, as the report
builds them), the second call after a warm-up, one thread:
- `fit`: the inputs-fit check, one eval forward without grad;
- `measured`: the memory estimate's ground truth, one inference forward and one AdamW
  training step (forward, the report's loss, backward, `step()`);
- `gradients`: one forward and backward (gradient flow, per-node numerics);
- `export`: `torch.export.export` (non-strict, the batch dim dynamic), `.module()`, and
  one run of the program at the sample;
- `compile`: Dynamo's trace, `torch.compile(backend="eager")`'s first call less one eval
  forward;
- `memory`: two training steps on torch's plain FakeTensorMode (its dispatch cache
  emptied first, as for every fake piece), at the batch and at twice it (the least a
  batch-scaling estimate runs; the report runs more: the advice's verification runs,
  the per-node forward).
Left out, so the floor is low: loading, the graph pass, the statistics over every
activation, the advice's runs, the exported program at the changed dims, every cost of
our own. The floor is the pieces' sum spread over the machine's cores, and at least the
longest piece; `floor / budget` above 1 means no report of this scope fits the budget
here, however its passes are arranged.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/floor.py
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/floor.py --only resnet18,deep
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipeline import CASES, cold_import_seconds, training_step_seconds  # noqa: E402

PIECES = ("fit", "measured", "gradients", "export", "compile", "memory")


def _second(fn: Any) -> float:
    """Seconds of the second call (the first warms lazy imports), with the fake tensors'
    dispatch cache emptied: a report's runs cannot find their model's ops there."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fn()
    FakeTensorMode.cache_clear()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _doubled(spec: str) -> str:
    data = json.loads(spec)
    dims = data.get("dims", {})
    if "B" in dims:
        dims["B"] *= 2
    return json.dumps(data)


def pieces(model_ref: str, spec: str) -> dict[str, float]:
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

    optimizer = torch.optim.AdamW(model.parameters())

    def train_step() -> None:
        model.train()
        loss(inputs).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    out: dict[str, float] = {"fit": _second(forward)}
    out["measured"] = out["fit"] + _second(train_step)
    out["gradients"] = _second(forward_backward)

    def export() -> None:
        model.eval()
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        shapes = tuple({0: torch.export.Dim.AUTO} if a.dim() else {} for a in tensors)
        shapes = shapes if len(tensors) == len(args) and not kwargs else None
        program = torch.export.export(model, args, kwargs, strict=False, dynamic_shapes=shapes)
        with torch.no_grad():
            program.module()(*args, **kwargs)

    out["export"] = _second(export)

    def dynamo() -> None:
        torch._dynamo.reset()
        model.eval()
        with torch.no_grad():
            torch.compile(model, backend="eager")(*args, **kwargs)

    out["compile"] = max(_second(dynamo) - out["fit"], 0.0)
    bigger = parse_input(_doubled(spec), loaded).build()

    def fake_steps() -> None:
        for batch in (inputs, bigger):
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

    out["memory"] = _second(fake_steps)
    return out


def one_case(name: str, steps: int) -> dict:
    model_ref, spec = CASES[name]
    step = training_step_seconds(model_ref, spec, steps)
    return {"case": name, "step_s": step, "pieces": pieces(model_ref, spec)}


def table(rows: list[dict], cores: int) -> str:
    head = "| case | step s | cold import s | budget s | " + " | ".join(PIECES)
    head += " | floor s | floor / budget |"
    lines = [head, "|" + "---|" * (len(PIECES) + 6)]
    for r in rows:
        budget = max(3 * r["step_s"], 2 * r["import_s"])
        p = r["pieces"]
        floor = max(sum(p.values()) / cores, max(p.values()))
        cells = " | ".join(f"{p[k]:.2f}" for k in PIECES)
        lines.append(
            f"| {r['case']} | {r['step_s']:.3f} | {r['import_s']:.2f} | {budget:.2f} | "
            f"{cells} | {floor:.2f} | **{floor / budget:.2f}** |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated cases: " + ",".join(CASES))
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
