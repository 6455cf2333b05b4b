"""Compare the reports of two `bench/pipeline.py --save DIR` runs, timings left out: a
speed change must leave every other field as it was.

    .venv/bin/python bench/report_diff.py /tmp/before /tmp/after
    .venv/bin/python bench/report_diff.py /tmp/before /tmp/after --rel 1e-3

With `--rel R`, two numbers within R of each other (relative) count as the same: a change
that sums in another order. Each such field is listed by name with the largest relative
difference seen, so what was tolerated is on the record.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# Fields that are clocks, not results.
TIMING_KEYS = {"timings_s", "seconds", "created_at"}


def stripped(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: stripped(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [stripped(v) for v in value]
    return value


def differences(
    a: Any, b: Any, path: str = "", rel: float = 0.0, close: dict | None = None
) -> list[str]:
    """Where `a` and `b` differ; `close` collects (field name -> largest relative
    difference) of the numbers within `rel`."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += differences(a.get(key), b.get(key), f"{path}.{key}", rel, close)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in differences(x, y, f"{path}[{i}]", rel, close)]
    if a == b:
        return []
    if rel and _numbers(a, b) and abs(a - b) <= rel * max(abs(a), abs(b)):
        if close is not None:
            name = path.rpartition(".")[2]
            close[name] = max(close.get(name, 0.0), abs(a - b) / max(abs(a), abs(b)))
        return []
    return [f"{path}: {str(a)[:120]} != {str(b)[:120]}"]


def _numbers(a: Any, b: Any) -> bool:
    kinds = (int, float)
    return isinstance(a, kinds) and isinstance(b, kinds) and not isinstance(a, bool)


def main(before: str, after: str, rel: float = 0.0) -> int:
    failed = 0
    for old in sorted(Path(before).glob("*.json")):
        new = Path(after, old.name)
        if not new.exists():
            continue
        close: dict[str, float] = {}
        diffs = differences(
            stripped(json.loads(old.read_text())),
            stripped(json.loads(new.read_text())),
            rel=rel,
            close=close,
        )
        verdict = f"{len(diffs)} differences" if diffs else "identical"
        if close and not diffs:
            verdict = f"identical within rel {rel:g}"
        print(f"{old.stem}: {verdict}")
        for name, worst in sorted(close.items()):
            print(f"  within: {name} (largest relative difference {worst:.1e})")
        for line in diffs[:20]:
            print("  " + line)
        failed += bool(diffs)
    return 1 if failed else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    tolerance = float(args[args.index("--rel") + 1]) if "--rel" in args else 0.0
    sys.exit(main(args[0], args[1], tolerance))
