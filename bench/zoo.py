"""The zoo sweep: every catalogue model (tests/zoo_models.py) inspected for real and with
--fake, each against the independent truth of tests/zoo_truth.py.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/zoo.py            # not heavy ones
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/zoo.py --all      # every model
    PYTHONPATH=. .venv/bin/python bench/zoo.py --only resnet18,hf-llama     # some
    PYTHONPATH=. .venv/bin/python bench/zoo.py --table                      # rows -> RESULTS.md

Each model runs in child processes (truth + real, then fake), so a native crash or a
hang costs one row. Rows are appended to bench/zoo_rows.jsonl as they finish; the table
goes into the "Zoo" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from zoo_table import write_results  # noqa: E402

ROWS = ROOT / "bench" / "zoo_rows.jsonl"


def run_child(name: str, mode: str, timeout: int, truth: dict | None = None) -> dict:
    """`python bench/zoo_child.py NAME MODE` -> its JSON, or what killed it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "row.json"
        if truth is not None:
            Path(f"{out}.truth").write_text(json.dumps(truth))
        cmd = [sys.executable, str(ROOT / "bench" / "zoo_child.py"), name, mode, str(out)]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"timed out after {timeout} s"}
        seconds = round(time.perf_counter() - start, 1)
        if out.exists():
            return {**json.loads(out.read_text()), "wall_s": seconds}
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        return {"ok": False, "error": f"exit {proc.returncode}: {tail[0][:200]}", "wall_s": seconds}


def kind_of(name: str) -> str:
    import zoo_models

    return zoo_models.ZOO[name].kind


def sweep(names: list[str], timeout: int) -> None:
    for name in names:
        row = {"name": name, "kind": kind_of(name), "real": run_child(name, "real", timeout)}
        row["fake"] = run_child(name, "fake", timeout, row["real"].get("truth"))
        row["real"].get("truth", {}).pop("ran", None)  # long; the rows keep only the counts
        with ROWS.open("a") as f:
            f.write(json.dumps(row) + "\n")
        real, fake = row["real"], row["fake"]
        print(
            name, real.get("ok"), fake.get("ok"), real.get("wall_s"), fake.get("wall_s"), flush=True
        )


def main() -> None:
    import inspector  # noqa: F401 - before torchvision

    # isort: split
    import zoo_models

    ap = argparse.ArgumentParser()
    ap.add_argument("--all", action="store_true", help="also the heavy models")
    ap.add_argument("--only", help="comma-separated zoo names")
    ap.add_argument("--skip-done", action="store_true", help="skip names already in the rows file")
    ap.add_argument("--table", action="store_true", help="only write the table from the rows")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per child")
    ap.add_argument("--note", default="", help="a paragraph for the table (e.g. a partial run)")
    args = ap.parse_args()
    if not args.table:
        names = args.only.split(",") if args.only else zoo_models.names(heavy=args.all)
        if args.skip_done and ROWS.exists():
            done = {json.loads(line)["name"] for line in ROWS.read_text().splitlines()}
            names = [n for n in names if n not in done]
        sweep(names, args.timeout)
    command = "OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/zoo.py" + (
        " --all" if args.all else ""
    )
    write_results(ROWS, ROOT / "bench" / "RESULTS.md", command, args.note)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
