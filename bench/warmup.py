"""The optimizer warm-up on fake tensors, full step against skipped in-place arithmetic
(inspector/memory/warmup.py), over the parameter shapes of bench/deep.py, interleaved.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/warmup.py
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from deep import deep_stack  # noqa: E402

from inspector.fakevalues import new_fake_mode  # noqa: E402
from inspector.memory.optimizer import make_optimizer  # noqa: E402
from inspector.memory.warmup import skipped_inplace_arithmetic  # noqa: E402


def one_step(params: list[torch.nn.Parameter], name: str, skip: bool) -> float:
    optimizer = make_optimizer(name, params)
    for p in params:
        p.grad = torch.zeros_like(p)
    start = time.perf_counter()
    with skipped_inplace_arithmetic() if skip else nullcontext():
        optimizer.step()
    return time.perf_counter() - start


def main(reps: int = 3) -> None:
    torch.set_num_threads(1)
    with new_fake_mode():
        params = [torch.nn.Parameter(torch.empty(p.shape)) for p in deep_stack().parameters()]
        for name in ("adamw", "momentum"):
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(reps):
                for skip in (False, True):
                    times[skip].append(one_step(params, name, skip))
            full, skipped = statistics.median(times[False]), statistics.median(times[True])
            print(
                f"{name}, {len(params)} params: full step {full:.2f} s, skipped "
                f"{skipped:.2f} s, ratio {skipped / full:.2f}"
            )


if __name__ == "__main__":
    main()
