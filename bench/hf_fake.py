"""Hugging Face models under --fake against the real report and a measured CPU step.

    PYTHONPATH=. .venv/bin/python bench/hf_fake.py                 # the six decoders
    PYTHONPATH=. .venv/bin/python bench/hf_fake.py mixtral swin    # some models
    PYTHONPATH=. .venv/bin/python bench/hf_fake.py --padded llama  # a mask with padding

Models from tiny configs (tests/hf_tiny_models.py), token ids + an attention mask (all
ones unless --padded) + labels at B=2, S=32; Swin on [2, 3, 32, 32]. Each row: the memory
pass on the real model (its estimate runs on fake copies; measured = torch.profiler on a
real step) and on the model built under --fake; AdamW, float32. Prints a Markdown table.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import hf_tiny_models  # noqa: E402  (tests/hf_tiny_models.py)

from inspector.analyze import inspect_model  # noqa: E402
from inspector.context import Options  # noqa: E402

MODELS = ROOT / "tests" / "hf_tiny_models.py"


def _pct(estimate: int | None, measured: int | None) -> str:
    if not estimate or not measured:
        return "-"
    return f"{100 * (estimate - measured) / measured:+.3f}%"


def _n(value: int | None) -> str:
    return f"{value:,}" if value is not None else "none"


def row(name: str, padded: bool) -> str:
    spec = hf_tiny_models.SWIN_SPEC if name == "swin" else hf_tiny_models.token_spec(padded=padded)
    options = dict(passes={"memory"}, export="none")
    start = time.perf_counter()
    real = inspect_model(f"{MODELS}:{name}", spec, Options(**options)).memory
    fake = inspect_model(f"{MODELS}:{name}", spec, Options(fake=True, **options)).memory
    m = real.measured
    saved = (real.saved_activation_bytes, fake.saved_activation_bytes)
    peak = (real.train_peak_bytes, fake.train_peak_bytes)
    measured = (m.saved_activation_bytes, m.train_peak_bytes) if m else (None, None)
    return (
        f"| {name} | {_n(saved[0])} / {_n(saved[1])} / {_n(measured[0])} "
        f"| {_pct(saved[1], measured[0])} "
        f"| {_n(peak[0])} / {_n(peak[1])} / {_n(measured[1])} | {_pct(peak[1], measured[1])} "
        f"| {fake.saved_activation_bytes == real.saved_activation_bytes} "
        f"| {time.perf_counter() - start:.1f} s |"
    )


def main(argv: list[str]) -> None:
    padded = "--padded" in argv
    names = [a for a in argv if not a.startswith("--")] or hf_tiny_models.DECODERS
    print("| model | saved B real / fake / measured | fake err | train peak B real / fake "
          "/ measured | fake err | fake == real | time |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name in names:
        try:
            print(row(name, padded), flush=True)
        except Exception as exc:  # noqa: BLE001 - a row that fails says why
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            print(f"| {name} | fails: {type(exc).__name__}: {first[:160]} |||||||", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
