"""Serving memory: the presets' figures, and tiny real models against the truth.

    PYTHONPATH=. .venv/bin/python bench/serving.py            # presets + truth checks
    PYTHONPATH=. .venv/bin/python bench/serving.py --quick    # GPT-2 and the truth checks

For each decoder preset: KV bytes per token, the cache of one sequence and how many
sequences fit 24/80/141 GiB at 4k/8k/32k tokens (all on fake tensors), and the time.
Truth: tiny Llama (GQA), Mistral (sliding window), GPT-2 and Mamba built for real on the
CPU; their cache after a real prefill against the report (ratio, 1.0000 = exact) and the
allocator's prefill peak (torch.profiler) against the report's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from inspector.analyze import inspect_model  # noqa: E402
from inspector.context import Options  # noqa: E402
from inspector.units import format_bytes  # noqa: E402

GIB = 1024**3
BUDGETS = (24 * GIB, 80 * GIB, 141 * GIB)
PRESETS = ("gpt2", "llama-3-8b", "llama-3-70b", "mistral-7b", "mixtral-8x7b")
CONTEXT = {"gpt2": 1024}  # its positions end there; the others start the table at 4k


def preset_rows(names: tuple[str, ...]) -> None:
    print("| preset | KV / token | context | cache / sequence | 24 GiB | 80 GiB | 141 GiB | time |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        start = time.perf_counter()
        spec = f'{{"dims": {{"B": 1, "S": {CONTEXT.get(name, 4096)}}}}}'
        report = inspect_model(f"preset:{name}", spec, Options(passes={"serving"}))
        seconds = time.perf_counter() - start
        s = report.serving
        if not s.computed:
            print(f"| {name} | not measured: {s.reason} | | | | | | {seconds:.1f} s |")
            continue
        for row in s.table:
            fits = [f"{row.max_concurrent_sequences.get(str(b), 0):,}" for b in BUDGETS]
            first = row is s.table[0]
            print(
                f"| {name if first else ''} | {format_bytes(s.kv_bytes_per_token) if first else ''}"
                f" | {row.context:,} | {format_bytes(row.cache_bytes_per_sequence)} | "
                + " | ".join(fits)
                + f" | {f'{seconds:.1f} s' if first else ''} |"
            )


def truth_rows() -> None:
    import test_serving as truth

    print("\n| tiny model | cache: real / report | prefill peak: allocator / report |")
    print("|---|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("llama", "mistral", "gpt2", "mamba"):
            serving = truth.report_for(name, Path(tmp)).serving
            cache, peak = truth.real_prefill(name)
            print(
                f"| {name} | {cache:,} / {serving.cache_bytes_per_sequence:,} = "
                f"{cache / serving.cache_bytes_per_sequence:.4f} | {peak:,} / "
                f"{serving.prefill_peak_bytes:,} = {peak / serving.prefill_peak_bytes:.4f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    preset_rows(("gpt2",) if args.quick else PRESETS)
    truth_rows()


if __name__ == "__main__":
    main()
