"""What oneDNN's Conv3d backward allocates inside itself at r3d_18's small spatial sizes
(issue #16: r3d_18's training peak is -2.7% against the allocator truth).

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/conv3d_scratch.py

Two Conv3d layers (64 -> 256 -> 256, 3x3x3) on a 2 x 64 x 1 x 2 x 2 input: the report's
training-step peak against the CPU profiler's, the profiler's peak per phase, and each
allocation above 1 MB of a size no parameter has (kernel scratch: the activations are tiny),
as multiples of the weights.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

MODEL = """
from torch import nn


class TwoConv3d(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv3d(64, 256, 3, padding=1, bias=False)
        self.b = nn.Conv3d(256, 256, 3, padding=1, bias=False)

    def forward(self, x):
        return self.b(self.a(x)).mean((2, 3, 4))
"""
SHAPE = [2, 64, 1, 2, 2]
PHASES = ("forward", "backward", "step")


def estimate(path: Path) -> tuple[int, int]:
    """(estimated, measured) training-step peak of the report."""
    from inspector.analyze import inspect_model
    from inspector.context import Options

    spec = json.dumps({"x": {"shape": SHAPE}})
    memory = inspect_model(f"{path}:TwoConv3d", spec, Options(passes={"graph", "memory"})).memory
    return memory.train_peak_bytes, memory.measured.train_peak_bytes


def profiled(model: nn.Module) -> list:
    """Kineto events of one AdamW step after the state exists."""
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    x = torch.randn(*SHAPE)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("forward"):
            loss = model(x).mean()
        with record_function("backward"):
            loss.backward()
        with record_function("step"):
            opt.step()
    return prof.profiler.kineto_results.events()


def phase_report(events: list, weights: dict[str, int]) -> None:
    spans = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name() in PHASES}
    allocs = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live, peaks = 0, dict.fromkeys(PHASES, 0)
    for t, size in allocs:
        live += size
        for name, (start, end) in spans.items():
            if start <= t <= end:
                peaks[name] = max(peaks[name], live)
    # weights, grads and AdamW state exist before the profile: bytes above them
    print("profiler peak per phase (bytes above the profile's start):", peaks)
    for name, (start, end) in spans.items():
        # a size no parameter has: scratch inside a kernel (activations here are tiny)
        scratch = [n for t, n in allocs if start <= t <= end and n > 1e6]
        scratch = [n for n in scratch if n not in weights.values()]
        multiples = [{w: round(n / b, 4) for w, b in weights.items()} for n in scratch]
        print(f"{name}: scratch allocations {scratch}, as multiples of the weights {multiples}")


def main() -> None:
    import inspector  # noqa: F401 - the project's import set-up

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "two_conv3d.py"
        path.write_text(MODEL)
        ours, measured = estimate(path)
        sys.path.insert(0, tmp)
        from two_conv3d import TwoConv3d

        torch.manual_seed(0)
        model = TwoConv3d().train()
        weights = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
        events = profiled(model)
    print(f"report: estimate {ours:,} B, measured {measured:,} B: {ours / measured - 1:+.1%}")
    print("weights (bytes):", weights)
    phase_report(events, weights)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
