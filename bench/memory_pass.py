"""Benchmark: the memory pass's seconds on zoo models (tests/zoo_models.py, their test
sizes), this tree against another, and whether the two give the same memory section.

Each model, in a fresh interpreter warmed as the service's zygote warms
(bench/pipeline.py `warm_as_zygote`), one thread: `inspect_model` with the graph and
memory passes (no measured step), passes forked as the service runs them; the memory
pass's seconds from the report's timings, and its section (with every node's saved and
live bytes) as JSON. With `--before TREE` (`git archive REV | tar -x -C TREE`) the same
with TREE's inspector, the trees alternating `--rounds` times; printed per model: each
tree's best seconds, after / before, and whether the sections are equal.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/memory_pass.py \\
        --before /tmp/base --only mobilenet_v3_small,googlenet,resnet50
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipeline import compared_trees, json_child  # noqa: E402 - bench/, the script's own folder


def one_model(name: str) -> dict:
    """This interpreter's inspector on zoo model `name`: the memory pass's seconds and
    its section."""
    sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]
    import torch

    import inspector  # noqa: F401 - before torchvision: its C++ ops are replaced

    torch.set_num_threads(1)
    import zoo_models
    from pipeline import warm_as_zygote

    from inspector.analyze import inspect_model
    from inspector.context import Options

    with tempfile.TemporaryDirectory() as folder:
        warm_as_zygote(Path(folder))
        source = zoo_models.entry_file(name, folder)
        options = Options(passes={"graph", "memory"}, measure=False)
        report = inspect_model(source, None, options)
    section = report.memory.model_dump(mode="json")
    section["nodes"] = [(n.name, n.saved_bytes, n.live_bytes_after) for n in report.nodes]
    return {"seconds": report.meta.timings_s.get("memory"), "section": section}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated zoo names")
    parser.add_argument("--before", metavar="TREE", help="another tree's inspector, alternating")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the trees")
    parser.add_argument("--model", help=argparse.SUPPRESS)  # the child's own model
    args = parser.parse_args()
    if args.model:
        print(json.dumps(one_model(args.model)))
        return 0
    trees = compared_trees(args.before)
    ratios, differ = [], []
    for name in args.only.split(","):
        best: dict[str, float] = {}
        sections: dict[str, dict] = {}
        for _ in range(args.rounds):
            for label, tree in trees:
                row = json_child([__file__, "--model", name], tree)
                best[label] = min(best.get(label, float("inf")), row["seconds"])
                sections[label] = row["section"]
        line = f"{name:40s} " + "  ".join(f"{k} {v:6.2f} s" for k, v in best.items())
        if "before" in best:
            ratios.append(best["after"] / best["before"])
            same = sections["after"] == sections["before"]
            line += f"  after / before {ratios[-1]:.2f}  sections {'equal' if same else 'DIFFER'}"
            if not same:
                differ.append(name)
        print(line, flush=True)
    if ratios:
        print(
            f"{len(ratios)} models: after / before median {statistics.median(ratios):.2f}, "
            f"range {min(ratios):.2f}-{max(ratios):.2f}; sections differ: {differ or 'none'}"
        )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
