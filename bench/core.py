"""Benchmark of the analysis core (capture + graph pass: shapes, params, FLOPs) against
torchinfo.summary on the same models in the same process, and of a fake-mode run of
GPT-2 small against one real forward.

    PYTHONPATH=. .venv/bin/python bench/core.py            # full sizes
    PYTHONPATH=. .venv/bin/python bench/core.py --quick    # small sizes, a smoke test
    PYTHONPATH=. .venv/bin/python bench/core.py --zoo mobilenet_v3_small,efficientnet_b0

`--zoo` takes zoo models (tests/zoo_models.py) at their test sizes instead, torchinfo
given the same inputs (a model torchinfo cannot summarise shows "-").
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import models  # noqa: E402
import torchinfo  # noqa: E402
from graph_helpers import inspect_ctx, make_ctx  # noqa: E402


def best_of(n: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(n):
        gc.collect()  # the last case's garbage is nobody's cost: collect it untimed
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def summary(model: torch.nn.Module, data: object) -> object:
    return torchinfo.summary(model, input_data=data, verbose=0)


def core(build, make_inputs, dims, fake=False) -> float:  # noqa: ANN001
    """Seconds of capture + graph pass, the model and inputs built beforehand."""
    return core_parts(build, make_inputs, dims, fake)[0]


def core_parts(build, make_inputs, dims, fake=False) -> tuple[float, float, str]:  # noqa: ANN001
    """(seconds of capture + graph pass, seconds of the capture alone, its method)."""
    ctx = make_ctx(build, make_inputs, dims, fake=fake)
    gc.collect()
    start = time.perf_counter()
    report = inspect_ctx(ctx)
    total = time.perf_counter() - start
    capture = sum(a.seconds or 0 for a in report.capture.attempts)
    return total, capture, report.capture.method or "none"


def gpt2_inputs(B: int, S: int) -> tuple[tuple, dict]:  # noqa: N803
    return (), {"input_ids": torch.randint(0, 50257, (B, S))}


def cases(quick: bool) -> list[tuple[str, Callable, Callable, dict]]:
    b, size, seq = (2, 64, 64) if quick else (8, 224, 256)
    large = [] if quick else [
        ("ResNet-18 [32,3,224,224]", models.ResNet18,
         lambda B: ((torch.randn(B, 3, 224, 224),), {}), {"B": 32}),
        ("GPT-2 small [8,1024]", lambda: models.make_gpt2()[0], gpt2_inputs, {"B": 8, "S": 1024}),
    ]  # fmt: skip
    return [
        (
            f"ResNet-18 [{b},3,{size},{size}]",
            models.ResNet18,
            lambda B: ((torch.randn(B, 3, size, size),), {}),
            {"B": b},
        ),
        ("MLP [32,784]", models.MLP, lambda B: ((torch.randn(B, 784),), {}), {"B": 32}),
        (
            f"GPT-2 small [2,{seq}]",
            lambda: models.make_gpt2()[0],
            lambda B, S: ((), {"input_ids": torch.randint(0, 50257, (B, S))}),
            {"B": 2, "S": seq},
        ),
        *large,
    ]


def zoo_cases(names: list[str]) -> list[tuple[str, Callable, Callable, dict]]:
    import inspector  # noqa: F401 - before torchvision: its C++ ops are replaced

    # isort: split
    import zoo_models

    cases = []
    for name in names:
        entry = zoo_models.ZOO[name]
        cases.append((name, entry.build, lambda inputs=entry.inputs, **_: inputs(), {}))
    return cases


def _summary_seconds(model: torch.nn.Module, args: tuple, kwargs: dict) -> float:
    data = kwargs if kwargs else list(args)
    try:
        return best_of(1, partial(summary, model, data))
    except Exception:  # noqa: BLE001 - torchinfo cannot run every model
        return float("nan")


def versus_torchinfo(
    quick: bool, repeats: int, chosen: list[tuple[str, Callable, Callable, dict]] | None = None
) -> list[str]:
    lines = [
        "| model | capture | core (s) | of which capture (s) | torchinfo (s) | core / torchinfo |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, build, make_inputs, dims in chosen or cases(quick):
        model = build()
        args, kwargs = make_inputs(**dims)
        ours, theirs, capture, method = float("inf"), float("inf"), 0.0, ""
        big = "1024" in name or "[32," in name
        for _ in range(1 if big else repeats):  # interleaved: a busy moment hits both
            total, cap, method = core_parts(build, make_inputs, dims)
            if total < ours:
                ours, capture = total, cap
            theirs = min(theirs, _summary_seconds(model, args, kwargs))
        ratio = "-" if math.isnan(theirs) else f"{ours / theirs:.2f}x"  # not summarised
        lines.append(f"| {name} | {method} | {ours:.3f} | {capture:.3f} | {theirs:.3f} | {ratio} |")
        print(lines[-1], flush=True)
    return lines


def fake_versus_real(quick: bool) -> list[str]:
    b, s = (2, 128) if quick else (8, 1024)
    model, (_, kwargs) = models.make_gpt2(batch=b, seq=s)
    with torch.no_grad():
        real = best_of(1, lambda: model(**kwargs))
    fake, capture, _ = core_parts(
        lambda: models.make_gpt2()[0], gpt2_inputs, {"B": b, "S": s}, fake=True
    )
    line = (
        f"| GPT-2 small [{b},{s}] | {fake:.2f} s (capture {capture:.2f} s) | {real:.2f} s "
        f"| {real / fake:.1f}x faster |"
    )
    print(line, flush=True)
    return ["| model | fake-mode core | one real forward | speed-up |", "|---|---|---|---|", line]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--zoo", help="comma-separated zoo models instead of the cases")
    opts = parser.parse_args()
    torch.manual_seed(0)
    # warm-up: first use of fx, export and fake tensors pays one-time import/caching costs
    core(models.MLP, lambda B: ((torch.randn(B, 784),), {}), {"B": 2})
    core(models.MLP, lambda B: ((torch.randn(B, 784),), {}), {"B": 2}, fake=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if opts.zoo:
        versus_torchinfo(opts.quick, opts.repeats, zoo_cases(opts.zoo.split(",")))
        return
    versus_torchinfo(opts.quick, opts.repeats)
    fake_versus_real(opts.quick)


if __name__ == "__main__":
    main()
