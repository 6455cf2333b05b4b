"""Issue #18's rules on the zoo: no false alarm on healthy standard models.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/zoo_rules.py [--only a,b]

Each model (tests/zoo_models.py, through the real loader) is inspected in its own process
under `--dtype fp16` (so fp16-underflow, activations and norm eps, is a warning when it
fires) with the passes those rules read: graph, gradients, numerics, modes, export (fast),
probe, compile (fast) and findings; the memory passes are left out (bench/zoo.py has them).
It prints every warning or error of the #18 rules, and their count against the models run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

RULES_18 = (
    "compile-graph-break", "softmax-before-cross-entropy", "eval-nondeterministic",
    "param-created-in-forward", "hardcoded-device", "softmax-saturated", "fp16-underflow",
    "export-mismatch", "batchnorm-stats", "data-parallel", "attention-materialized",
    "ddp-unused-parameters",
)  # fmt: skip
PASSES = ("graph", "gradients", "numerics", "modes", "export", "probe", "compile", "findings")
# A spread of families: classic, torchvision CNNs and transformers, timm, HF encoders,
# decoders, encoder-decoders, audio and vision.
DEFAULT = (
    "custom-fn,lstm,resnet18,mobilenet_v3_small,efficientnet_b0,convnext_tiny,swin_t,"
    "deeplabv3_mobilenet_v3_large,r3d_18,timm-levit_128s,timm-convnext_atto,timm-vit_tiny,"
    "timm-mixer_s16,hf-bert,hf-distilbert,hf-deberta-v2,hf-gpt2,hf-llama,hf-t5,hf-bart,"
    "hf-clip,hf-whisper,hf-wav2vec2"
)


def child(name: str) -> dict:
    """In the child process: the #18 findings at warning/error of one model."""
    import inspector  # noqa: F401 - before torchvision: its C++ ops are replaced

    # isort: split
    import zoo_compare

    report = zoo_compare.inspect_zoo(name, fake=False, dtype="fp16", passes=set(PASSES))
    found = [f for f in report.findings if f.rule in RULES_18]
    return {
        "alarms": [
            f"{f.rule}@{f.where}: {f.message[:160]}"
            for f in found
            if f.severity in ("warning", "error")
        ],  # fmt: skip
        "info": sorted({f.rule for f in found if f.severity == "info"}),
        "seconds": round(sum(report.meta.timings_s.values()), 1),
    }


def run(name: str, timeout: int) -> dict:
    cmd = [sys.executable, __file__, "--child", name]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    last = (proc.stdout or "").strip().splitlines()[-1:]
    if proc.returncode or not last:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {proc.returncode}: {tail[0][:200]}"}
    return json.loads(last[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=DEFAULT, help="comma-separated zoo names")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    names, alarmed, failed = args.only.split(","), 0, 0
    start = time.perf_counter()
    for name in names:
        row = run(name, args.timeout)
        alarmed += bool(row.get("alarms"))
        failed += "error" in row
        print(name, json.dumps(row), flush=True)
    print(
        f"{alarmed} of {len(names)} models raise a #18 warning/error ({failed} did not run); "
        f"{time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
