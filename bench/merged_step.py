"""Probe for issue #17's merged instrumented step: can the gradients pass's eager forward
and backward stand in for the measured step's (inspector/memory/measure.py), so a report
runs one real forward and backward fewer?

For each model, in a fresh interpreter: the gradients, numerics, modes and memory passes
in one process (no forks), the gradients pass's forward and backward recorded with the
same allocation-only profiler the measured step uses (inspector/memory/allocations.py),
and the inspector's own work in it (the numerics statistics, the train/eval comparison,
the per-node and per-parameter gradient statistics, the loss's formation) in windows
whose allocations, and their frees, are left out. Its figures, relative to where the
recording began, against the measured step's in the same run:

- forward/backward peak: the measured training peak less what was resident before the
  step (weights, buffers, optimizer state: the estimate's static bytes) and the inputs;
- saved: live bytes as the backward begins, against the measured saved activations less
  the inputs autograd saved (allocated before the recording).

`--mean-loss` forms the memory step's own loss (the sum of the outputs' means) in place
of the gradients pass's random-direction loss, outside the windows. The differences that
remain are what a merged step must account for: the output's storage, which the
gradients pass holds through its backward (its own reference, and the modes recorder's
detached alias of it), and the optimizer's phase (a model whose peak is its optimizer
step: the merged figure is lower by that step's temporaries).

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/merged_step.py
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/merged_step.py --mean-loss \
        --only resnet18,timm-levit_128s,hf-bert,gru,vit_b_16,mobilenet_v3_small
"""

from __future__ import annotations

import argparse
import bisect
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("OMP_NUM_THREADS", "1")

OURS = "inspector.ours"  # a window of the inspector's own work
RESNET = (
    "examples/resnet.py:resnet18",
    '{"x": {"shape": ["B", 3, 224, 224]}, "dims": {"B": 8}}',
)


def _in_window(fn: Any) -> Any:
    import torch

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(OURS):
            return fn(*args, **kwargs)

    return wrapped


def _patch(mean_loss: bool, found: dict) -> None:
    """The inspector's own work into windows, and the gradients pass's forward and
    backward recorded into `found`."""
    import torch

    import inspector.health.backprop as backprop
    import inspector.health.eagergraph as eagergraph
    import inspector.health.nodegrads as nodegrads
    import inspector.passes.gradients as gradients
    import inspector.passes.modes as modes
    import inspector.passes.numerics as numerics
    from inspector.memory.allocations import allocations_recorded
    from inspector.memory.loss import default_loss

    numerics.Observer.on_value = _in_window(numerics.Observer.on_value)
    modes.TrainRecorder._keep = _in_window(modes.TrainRecorder._keep)
    nodegrads.record_grad = eagergraph.record_grad = _in_window(nodegrads.record_grad)
    backprop._grad_stats = _in_window(backprop._grad_stats)
    if mean_loss:
        backprop.make_loss = lambda output, inputs, loss_fn: (default_loss(output, inputs), "")
    else:
        backprop.make_loss = _in_window(backprop.make_loss)
    tensor_backward = torch.Tensor.backward

    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function("inspector.backward"):
            return tensor_backward(self, *args, **kwargs)

    torch.Tensor.backward = backward
    backward_once = gradients.backward_once

    def recorded(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        inputs = {id(t): t for t in ctx.inputs.tensors()}.values()
        found["input_bytes"] = sum(t.untyped_storage().nbytes() for t in inputs)
        with allocations_recorded() as roots:
            run = backward_once(ctx, *args, **kwargs)
        found.update(_figures(roots()))
        return run

    gradients.backward_once = recorded


def _figures(roots: list[Any]) -> dict:
    """Peak, live bytes as the backward begins and at the end, relative to the start,
    with the windows' allocations and their frees left out."""
    from torch._C._profiler import _EventType

    events, ours, backward = [], [], None
    stack = list(roots)
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            events.append((event.start_time_ns, fields.alloc_size, fields.ptr))
        elif event.name == OURS:
            ours.append((event.start_time_ns, event.end_time_ns))
        elif event.name == "inspector.backward":
            backward = event.start_time_ns
    events.sort()
    ours.sort()
    starts = [s for s, _ in ours]

    def inside(t: int) -> bool:
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and ours[i][0] <= t <= ours[i][1]

    counted, left_out, live, peak, at_backward = set(), set(), 0, 0, None
    for t, size, ptr in events:
        if size > 0:
            if inside(t):
                left_out.add(ptr)
                continue
            counted.add(ptr)
        elif ptr in left_out:
            left_out.discard(ptr)
            continue
        elif ptr in counted:
            counted.discard(ptr)
        else:
            continue
        if backward is not None and at_backward is None and t >= backward:
            at_backward = live
        live += size
        peak = max(peak, live)
    return {"peak": peak, "at_backward": at_backward, "end": live, "windows": len(ours)}


def one_model(name: str, mean_loss: bool) -> dict:
    import torch

    import inspector  # noqa: F401 - before torchvision: its C++ ops are replaced

    torch.set_num_threads(1)
    found: dict = {}
    _patch(mean_loss, found)
    from inspector.analyze import inspect_model
    from inspector.context import Options

    with tempfile.TemporaryDirectory() as folder:
        if name == "resnet18":
            source, spec = RESNET
        else:
            sys.path.insert(0, str(ROOT / "tests"))
            import zoo_models

            source, spec = zoo_models.entry_file(name, folder), None
        passes = {"gradients", "numerics", "modes", "memory"}
        report = inspect_model(source, spec, Options(passes=passes, isolate=False))
    mem, measured = report.memory, report.memory.measured
    if measured is None or "peak" not in found:
        return {"name": name, "error": "no measured step or no eager backward"}
    resident = mem.param_bytes + mem.buffer_bytes + mem.optimizer_bytes
    return {
        "name": name,
        "merged_peak": found["peak"],
        "measured_peak": measured.train_peak_bytes - resident - found["input_bytes"],
        "merged_at_backward": found["at_backward"],
        "measured_saved": measured.saved_activation_bytes,
        "grad_bytes": mem.grad_bytes,
        "merged_end": found["end"],
        "windows": found["windows"],
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| model | merged f/b peak B | measured peak less resident B | difference B "
        "| merged at backward B | measured saved B | windows |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['error']} | | | | | |")
            continue
        diff = r["merged_peak"] - r["measured_peak"]
        lines.append(
            f"| {r['name']} | {r['merged_peak']:,} | {r['measured_peak']:,} | {diff:+,} "
            f"| {r['merged_at_backward']:,} | {r['measured_saved']:,} | {r['windows']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="resnet18", help="resnet18 and/or zoo names")
    parser.add_argument("--mean-loss", action="store_true", help="the memory step's loss")
    parser.add_argument("--model", help=argparse.SUPPRESS)  # the child's own model
    args = parser.parse_args()
    if args.model:
        print(json.dumps(one_model(args.model, args.mean_loss)))
        return 0
    rows = []
    for name in args.only.split(","):
        cmd = [sys.executable, __file__, "--model", name] + (
            ["--mean-loss"] if args.mean_loss else []
        )
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
