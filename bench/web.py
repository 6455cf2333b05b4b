"""Time to interactive of the report page for synthetic reports of 100, 1,000, 5,000 nodes,
and for real report files (`--report`, e.g. the Llama-3-70B preset's).

Runs the real app (uvicorn, SQLite in a temp dir) and headless Debian Chromium. "Table"
is when the module tree is built (the page's `mgi:table` mark); "interactive" is when
the table and all four charts are drawn (`window.__reportReady`); "graph" is the first
paint of the graph view (`mgi:graph`), all measured from navigation start. "Open all
blocks" is the time to expand the collapsed box holding the most nodes (the synthetic
reports' `layers` list of n / 5 block boxes) and lay the graph out again; "page" is the
HTML's size (the report JSON is in it).
Each report is loaded once to warm up, then `--runs` times; the median is reported.
Targets at 5,000 nodes and for the 70B preset: interactive < 1.5 s, graph < 2 s.

    .venv/bin/python bench/web.py [--runs 5] [--sizes 100,1000,5000] [--report FILE.json ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from pages_data import synthetic_report  # noqa: E402
from pages_server import live_server, make_settings  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from inspector.report import Report  # noqa: E402

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update"]  # fmt: skip
MEASURE = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const mark = performance.getEntriesByName('mgi:table')[0];
  const graph = performance.getEntriesByName('mgi:graph')[0];
  return {html: nav.responseEnd, table: mark ? mark.startTime : null,
          ready: window.__reportReady, graph: graph ? graph.startTime : null,
          bytes: nav.decodedBodySize};
}"""
EXPAND = """async () => {
  // The collapsed box holding the most nodes (the block list), opened and laid out again.
  const g = document.getElementById('report-graph').mgiGraph;
  const boxes = g.state.view.items.filter((i) => i.kind === 'box');
  if (!boxes.length) return null;
  const count = (i) => g.state.model.groups.get(i.path).count;
  const box = boxes.reduce((a, b) => (count(b) > count(a) ? b : a));
  if (count(box) < 50) return null;  // small reports start with their blocks open
  const start = performance.now();
  await g.expand(box.path);
  return performance.now() - start;
}"""


def measure(page, url: str) -> dict[str, float]:
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", state="attached", timeout=60_000)
    page.wait_for_selector("#report-graph[data-graph-ready='1']", state="attached", timeout=60_000)
    return page.evaluate(MEASURE)


def reports(sizes: list[int], files: list[str]) -> dict[str, Report]:
    """{row label: report}: the synthetic sizes, then each file by its name."""
    found = {f"{n:,} nodes": synthetic_report(n) for n in sizes}
    for name in files:
        found[Path(name).stem] = Report.model_validate(json.loads(Path(name).read_text()))
    return found


def row(label: str, report: Report, runs: list[dict], expand: float | None) -> str:
    keys = ("html", "table", "ready", "graph")
    med = {k: statistics.median(r[k] for r in runs) for k in keys}
    size = runs[0]["bytes"] / 1024**2
    opened = "open at start" if expand is None else f"{expand:.0f}"
    return (f"| {label} | {len(report.nodes):,} | {med['html']:.0f} | {med['table']:.0f} "
            f"| {med['ready']:.0f} | {med['graph']:.0f} | {opened} | {size:.1f} MiB |")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", default="100,1000,5000", help="synthetic sizes; '' for none")
    parser.add_argument("--report", action="append", default=[], help="a report JSON file")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    todo = reports(sizes, args.report)
    with tempfile.TemporaryDirectory() as tmp, live_server(make_settings(Path(tmp))) as srv:
        slugs = {label: srv.insert(r, name=f"bench {label}") for label, r in todo.items()}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            print("| report | nodes | HTML received (ms) | table built (ms) | interactive (ms) "
                  "| graph painted (ms) | open all blocks (ms) | page |")  # fmt: skip
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            for label, slug in slugs.items():
                measure(page, f"{srv.url}/r/{slug}")  # warm-up
                runs = [measure(page, f"{srv.url}/r/{slug}") for _ in range(args.runs)]
                print(row(label, todo[label], runs, page.evaluate(EXPAND)), flush=True)
            browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
