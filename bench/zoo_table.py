"""The zoo table: bench/zoo_rows.jsonl -> the "Zoo" section of bench/RESULTS.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["write_results", "table"]

_HEADER = (
    "| model | kind | capture | real | fake | blank modules | params | FLOPs ratio "
    "| saved err real / fake | peak err real / fake | warnings+errors (real) | red verdicts "
    "| analysis warnings (real) "
    "| time real / fake s |\n"
    "|---|---|---|---|---|---:|---|---:|---:|---:|---|---|---:|---:|\n"
)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:+.1f}%"


def _ok(half: dict) -> str:
    return "ok" if half.get("ok") else f"**fail**: {half.get('error', '?')[:90]}"


def _params(real: dict, fake: dict) -> str:
    marks = [h.get("params_exact") for h in (real, fake) if h.get("ok")]
    if not marks:
        return "–"
    return "exact" if all(marks) else "**off**"


def _flops(real: dict, fake: dict) -> str:
    ratios = [h.get("flops_ratio") for h in (real, fake) if h.get("ok")]
    shown = {f"{r:.3f}" for r in ratios if r is not None}
    return " / ".join(sorted(shown)) or "–"


def _rules(half: dict) -> str:
    rules = sorted({a.split("@")[0] for a in half.get("alarms", [])})
    return ", ".join(rules) or "none"


def _row(row: dict) -> str:
    real, fake = row["real"], row["fake"]
    kind = row.get("kind", "")
    blank = max(len(real.get("blank", [])), len(fake.get("blank", [])))
    cells = [
        row["name"],
        kind,
        real.get("capture") or fake.get("capture") or "–",
        _ok(real),
        _ok(fake),
        str(blank),
        _params(real, fake),
        _flops(real, fake),
        f"{_pct(real.get('saved_err'))} / {_pct(fake.get('saved_err'))}",
        f"{_pct(real.get('peak_err'))} / {_pct(fake.get('peak_err'))}",
        _rules(real) if real.get("ok") else "–",
        str(len(real.get("red", []))) if real.get("ok") else "–",
        str(len(real.get("warnings", []))) if real.get("ok") else "–",
        f"{real.get('seconds', '–')} / {fake.get('seconds', '–')}",
    ]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def _latest(rows_file: Path) -> list[dict]:
    rows: dict[str, dict] = {}
    for line in rows_file.read_text().splitlines():
        row = json.loads(line)
        rows[row["name"]] = row  # a rerun replaces the row
    return list(rows.values())


def _counts(rows: list[dict]) -> str:
    real = [r["real"] for r in rows if r["real"].get("ok")]
    fake = [r["fake"] for r in rows if r["fake"].get("ok")]
    both = real + fake

    def within(key: str, tol: float, halves: list[dict]) -> str:
        vals = [h.get(key) for h in halves if h.get(key) is not None]
        return f"{sum(abs(v) <= tol for v in vals)}/{len(vals)}"

    flops = [h["flops_ratio"] for h in both if h.get("flops_ratio") is not None]
    clean = [h for h in real if not h.get("alarms") and not h.get("red")]
    exact = sum(h["params_exact"] for h in both)
    close = sum(abs(r - 1) <= 0.01 for r in flops)
    return (
        f"{len(rows)} models; report produced real {len(real)}/{len(rows)}, fake "
        f"{len(fake)}/{len(rows)}; params exact {exact}/{len(both)} reports; "
        f"FLOPs within 1% {close}/{len(flops)}; saved within 1% real "
        f"{within('saved_err', 0.01, real)}, fake {within('saved_err', 0.01, fake)}; "
        f"peak within 2% real {within('peak_err', 0.02, real)}, fake "
        f"{within('peak_err', 0.02, fake)}; no blank module "
        f"{sum(not h.get('blank') for h in both)}/{len(both)}; no warning/error finding and "
        f"no red verdict on the healthy model (real) {len(clean)}/{len(real)}; no warning of "
        f"the analysis (real) {sum(not h.get('warnings') for h in real)}/{len(real)}."
    )


def table(rows_file: Path) -> str:
    rows = _latest(rows_file)
    return _counts(rows) + "\n\n" + _HEADER + "\n".join(_row(r) for r in rows) + "\n"


def write_results(rows_file: Path, results: Path, command: str, note: str = "") -> None:
    if not rows_file.exists():
        return
    section = (
        "## Zoo\n\n"
        "Every zoo model (tests/zoo_models.py) inspected for real and with `--fake`, against the\n"
        "independent truth of tests/zoo_truth.py (FlopCounterMode with CPU SDPA added,\n"
        "saved-tensor hooks, profiler allocator events over one AdamW step). Errors are\n"
        "(estimate - truth) / truth. Findings: bench/ZOO_FINDINGS.md.\n\n"
        f"    {command}\n\n" + (f"{note}\n\n" if note else "") + table(rows_file)
    )
    text = results.read_text() if results.exists() else ""
    if "## Zoo\n" in text:
        text = re.sub(r"## Zoo\n.*?(?=\n## |\Z)", lambda m: section, text, flags=re.S)
    else:
        text = section + "\n" + text
    results.write_text(text)
