"""The CUDA path, on a machine with an NVIDIA GPU: the training-step memory estimate (fake
tensors, 512-byte blocks like the caching allocator) against `torch.cuda.max_memory_allocated`
of the same step run for real, and the analysis core on a CUDA model (guided fx, a meta run
standing for the GPU, the fused-attention backward) against a real forward + backward
under FlopCounterMode.

    PYTHONPATH=. python bench/cuda.py       # skips with a message where there is no GPU
    PYTHONPATH=. .venv/bin/python bench/cuda.py --device cpu --quick   # a dry run of the script
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import models  # noqa: E402
from graph_helpers import inspect_ctx, make_ctx  # noqa: E402

from inspector.context import Inputs  # noqa: E402
from inspector.memory.measure import measure  # noqa: E402
from inspector.memory.shadow import fake_inputs, fake_shadow, new_fake_mode  # noqa: E402
from inspector.memory.step import StepOptions, train_step  # noqa: E402


def gpt2(batch: int, seq: int, layers: int = 12) -> tuple[torch.nn.Module, tuple, dict]:
    model, (_, kwargs) = models.make_gpt2(batch=batch, seq=seq, n_layer=layers)
    return model.train(), (), kwargs


def small_cnn() -> tuple[torch.nn.Module, tuple, dict]:
    model, (args, _) = models.make_small_cnn(8)
    return model, args, {}


def cases(quick: bool) -> dict:
    if quick:  # the dry run on a CPU
        return {"small CNN [8,3,32,32]": small_cnn, "GPT-2 2 layers [2,64]": lambda: gpt2(2, 64, 2)}
    return {
        "small CNN [8,3,32,32]": small_cnn,
        "ResNet-18 [32,3,224,224]": lambda: (
            models.ResNet18(),
            (torch.randn(32, 3, 224, 224),),
            {},
        ),
        "GPT-2 small [8,512]": lambda: gpt2(8, 512),
    }


def memory_rows(device: str, quick: bool) -> list[str]:
    """The step's peak: our fake-tensor estimate against the same step run for real."""
    block = 512 if device == "cuda" else 1  # the caching allocator's granularity
    lines = ["| model | estimate (fake) | measured | error |", "|---|---:|---:|---:|"]
    for name, build in cases(quick).items():
        model, args, kwargs = build()
        model = model.to(device)
        inputs = Inputs(
            tuple(a.to(device) for a in args), {k: v.to(device) for k, v in kwargs.items()}
        )
        mode = new_fake_mode()
        opts = StepOptions(optimizer="adamw", device=device, round_to=block, fake_mode=mode)
        estimate = train_step(fake_shadow(model, mode), fake_inputs(inputs, mode), opts).peak_bytes
        run = measure(model, inputs, StepOptions(optimizer="adamw", device=device, round_to=block))
        error = (estimate - run.train_peak_bytes) / run.train_peak_bytes
        measured = run.train_peak_bytes
        lines.append(f"| {name} | {estimate / 2**20:,.1f} MiB | {measured / 2**20:,.1f} MiB "
                     f"({run.method}) | {error:+.2%} |")  # fmt: skip
        print(lines[-1], flush=True)
        del model, inputs
        if device == "cuda":
            torch.cuda.empty_cache()
    return lines


def core_rows(device: str, quick: bool) -> list[str]:
    """GPT-2 (2 layers) on the device: what the core counts (guided fx, a meta run standing
    for the device) against a real forward + backward under FlopCounterMode (torch picks
    flash attention on a GPU; the meta run takes the math path and asks torch's choice)."""
    lines = ["| check | ours | real run |", "|---|---:|---:|"]
    b, s = (2, 64) if quick else (4, 512)

    def build() -> torch.nn.Module:
        return models.make_gpt2(n_layer=2)[0].to(device)

    def ids(B: int, S: int) -> tuple:  # noqa: N803
        return (), {"input_ids": torch.randint(0, 50257, (B, S), device=device)}

    ctx = make_ctx(build, ids, {"B": b, "S": s})
    start = time.perf_counter()
    report = inspect_ctx(ctx)
    seconds = time.perf_counter() - start
    counter = FlopCounterMode(display=False)
    with counter:
        out = ctx.model(**ctx.inputs.kwargs).logits
        forward = counter.get_total_flops()
        out.float().pow(2).mean().backward()
    backward = counter.get_total_flops() - forward
    meta = ctx.results.graph.on_meta
    device_seen = next((t.device for n in report.nodes for t in n.output_tensors), "-")
    rows = [
        ("capture, meta run", f"{report.capture.method}, meta={meta}", f"{seconds:.2f} s"),
        ("device in the report", device_seen, str(out.device)),
        ("forward FLOPs", f"{report.totals.flops_forward:,}", f"{forward:,}"),
        ("backward FLOPs", f"{report.totals.flops_backward:,}", f"{backward:,}"),
        ("logits shape", str(report.module("").output_shapes[0]), str(list(out.shape))),
    ]
    for check, ours, real in rows:
        lines.append(f"| {check} | {ours} | {real} |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    if opts.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: nothing to check")
        return
    name = torch.cuda.get_device_name() if opts.device == "cuda" else opts.device
    print(f"torch {torch.__version__}, {name}", flush=True)
    memory_rows(opts.device, opts.quick)
    core_rows(opts.device, opts.quick)


if __name__ == "__main__":
    main()
