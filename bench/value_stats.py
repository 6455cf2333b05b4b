"""Benchmark: the value statistics a report takes of every module output (numerics'
`tensor_stats`), alone and inside an allocation recording as the gradients pass's recorded
step holds them (stopped and read), with the allocation events that recording kept.

ResNet-18's 76 module outputs at [8, 3, 224, 224] (70.3 M values), kept from one forward.
With `--before TREE` (`git archive REV | tar -x -C TREE`), the same in a child process
with TREE's inspector package, the trees alternating; printed: each tree's best of
`--repeats`, and after / before.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/value_stats.py --before /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipeline import compared_trees, json_child  # noqa: E402 - bench/, the script's own folder


def measure(repeats: int) -> dict:
    """This interpreter's inspector: best seconds alone, best recorded, events recorded."""
    import torch

    torch.set_num_threads(1)
    from inspector.health.stats import tensor_stats
    from inspector.health.values import kind_of
    from inspector.loaders.load import load_model
    from inspector.memory.allocations import allocations_recorded, ours, ours_left_out, read_events

    model = load_model(str(ROOT / "examples/resnet.py") + ":resnet18").model.train()
    outputs = []
    hooks = [
        m.register_forward_hook(lambda m, a, out: outputs.append((kind_of(m), out.clone())))
        for m in model.modules()
    ]
    with torch.no_grad():
        model(torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(0)))
    for hook in hooks:
        hook.remove()

    def all_stats() -> None:
        for kind, value in outputs:
            tensor_stats(value, kind)

    alone, recorded, events = [], [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        all_stats()
        alone.append(time.perf_counter() - start)
        with ours_left_out():
            start = time.perf_counter()
            with allocations_recorded() as roots, ours():
                all_stats()
            events = len(read_events(roots()).events)
            recorded.append(time.perf_counter() - start)
    values = sum(v.numel() for _, v in outputs)
    return {"alone_s": min(alone), "recorded_s": min(recorded), "events": events, "values": values}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="TREE", help="another tree's inspector, alternating")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the trees")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.repeats)))
        return 0
    trees = compared_trees(args.before)
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for label, tree in trees:
            row = json_child([__file__, "--child", "--repeats", str(args.repeats)], tree)
            print(
                f"{label}: {row['values'] / 1e6:.1f} M values, alone {row['alone_s']:.3f} s, "
                f"recorded {row['recorded_s']:.3f} s, {row['events']} events",
                flush=True,
            )
            kept = best.setdefault(label, row)
            for key in ("alone_s", "recorded_s"):
                kept[key] = min(kept[key], row[key])
    if "before" in best:
        before, after = best["before"], best["after"]
        print(
            f"after / before: alone {after['alone_s'] / before['alone_s']:.2f}, "
            f"recorded {after['recorded_s'] / before['recorded_s']:.2f}, "
            f"events {after['events']} / {before['events']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
