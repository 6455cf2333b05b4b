"""Compare the reports of two `bench/pipeline.py --save DIR` runs, timings left out: a
speed change must leave every other field as it was.

    .venv/bin/python bench/report_diff.py /tmp/before /tmp/after
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


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += differences(a.get(key), b.get(key), f"{path}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:120]} != {str(b)[:120]}"]


def main(before: str, after: str) -> int:
    failed = 0
    for old in sorted(Path(before).glob("*.json")):
        new = Path(after, old.name)
        if not new.exists():
            continue
        diffs = differences(
            stripped(json.loads(old.read_text())), stripped(json.loads(new.read_text()))
        )
        print(f"{old.stem}: {'identical' if not diffs else f'{len(diffs)} differences'}")
        for line in diffs[:20]:
            print("  " + line)
        failed += bool(diffs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
