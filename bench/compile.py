"""What the torch.compile readiness check (report.compile) costs and finds: the whole
inspection of each model, and the `compile` stage's share of it (meta.timings_s).

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/compile.py
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/compile.py --quick   # tiny GPT-2 only
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inspector.analyze import inspect_model  # noqa: E402
from inspector.context import Options  # noqa: E402

TINY_GPT2 = """from transformers import GPT2Config, GPT2LMHeadModel
def gpt2_tiny():
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100,
                                      n_positions=64))
"""
IDS = '{{"input_ids": {{"shape": ["B", "S"], "dtype": "int64", "high": {high}}}, ' \
      '"dims": {{"B": {b}, "S": {s}}}}}'  # fmt: skip
CASES = [
    ("GPT-2 tiny (2 layers, d=64)", "TINY:gpt2_tiny", IDS.format(high=100, b=2, s=16), False),
    ("ResNet-18", "examples/resnet.py:resnet18",
     '{"x": {"shape": ["B", 3, 224, 224]}, "dims": {"B": 8}}', False),
    ("GPT-2 small (124M)", "examples/gpt2.py:gpt2", IDS.format(high=50257, b=2, s=64), False),
    ("GPT-2 small (124M), --fake", "examples/gpt2.py:gpt2", IDS.format(high=50257, b=4, s=512),
     True),
]  # fmt: skip


def run(name: str, model: str, spec: str, fake: bool) -> dict:
    """The whole inspection (default --compile fast), then graph + compile at --compile all."""
    start = time.perf_counter()
    report = inspect_model(model, spec, Options(fake=fake))
    total = time.perf_counter() - start
    counted = Options(fake=fake, compile="all", passes={"graph", "compile"})
    full = inspect_model(model, spec, counted)
    c = report.compile
    return {
        "model": name,
        "total_s": round(total, 2),
        "compile_fast_s": report.meta.timings_s.get("compile"),
        "compile_all_s": full.meta.timings_s.get("compile"),
        "recompiles_all": {r.dim: r.recompiles for r in full.compile.recompiles},
        "graph_count": c.graph_count,
        "graph_break_count": c.graph_break_count,
        "breaks": [f"{b.where}: {b.reason}" for b in c.breaks],
        "recompiles_fast": {r.dim: r.recompiles for r in c.recompiles},
        "guards": {r.dim: r.guards[:1] for r in c.recompiles},
        "error": c.error,
        "compile_findings": sum(f.rule == "compile-graph-break" for f in report.findings),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tiny = Path(tmp) / "tiny.py"
        tiny.write_text(TINY_GPT2)
        for name, model, spec, fake in CASES[:1] if args.quick else CASES:
            row = run(name, model.replace("TINY", str(tiny)), spec, fake)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
