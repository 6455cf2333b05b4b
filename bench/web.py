"""Time to interactive of the report page for synthetic reports of 100, 1,000, 5,000 nodes.

Runs the real app (uvicorn, SQLite in a temp dir) and headless Debian Chromium. "Table"
is when the module tree is built (the page's `mgi:table` mark); "interactive" is when
the table and all four charts are drawn (`window.__reportReady`); "graph" is the first
paint of the graph view, collapsed to its top-level modules (`mgi:graph`), all measured
from navigation start. "Open all blocks" is the time to expand the `layers` list (n / 5
block boxes) and lay it out again. Each size is loaded once to warm up, then `--runs`
times; the median is reported. Targets at 5,000 nodes: interactive < 1.5 s, graph < 2 s.

    .venv/bin/python bench/web.py [--runs 5] [--sizes 100,1000,5000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from pages_data import synthetic_report  # noqa: E402
from pages_server import live_server, make_settings  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update"]  # fmt: skip
MEASURE = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const mark = performance.getEntriesByName('mgi:table')[0];
  const graph = performance.getEntriesByName('mgi:graph')[0];
  return {html: nav.responseEnd, table: mark ? mark.startTime : null,
          ready: window.__reportReady, graph: graph ? graph.startTime : null,
          bytes: nav.transferSize};
}"""
EXPAND = """async () => {
  const g = document.getElementById('report-graph').mgiGraph;
  if (g.state.expanded.has('layers')) return null;  // small reports start with it open
  const start = performance.now();
  await g.expand('layers');
  return performance.now() - start;
}"""


def measure(page, url: str) -> dict[str, float]:
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", state="attached", timeout=60_000)
    page.wait_for_selector("#report-graph[data-graph-ready='1']", state="attached", timeout=60_000)
    return page.evaluate(MEASURE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", default="100,1000,5000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp, live_server(make_settings(Path(tmp))) as srv:
        slugs = {n: srv.insert(synthetic_report(n), name=f"bench {n}") for n in sizes}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            print("| nodes | HTML received (ms) | table built (ms) | interactive (ms) "
                  "| graph painted (ms) | open all blocks (ms) | size |")  # fmt: skip
            print("|---:|---:|---:|---:|---:|---:|---:|")
            for n, slug in slugs.items():
                measure(page, f"{srv.url}/r/{slug}")  # warm-up
                runs = [measure(page, f"{srv.url}/r/{slug}") for _ in range(args.runs)]
                keys = ("html", "table", "ready", "graph")
                med = {k: statistics.median(r[k] for r in runs) for k in keys}
                expand = page.evaluate(EXPAND)
                size = runs[0]["bytes"] / 1024**2
                opened = "open at start" if expand is None else f"{expand:.0f}"
                print(f"| {n:,} | {med['html']:.0f} | {med['table']:.0f} | {med['ready']:.0f} "
                      f"| {med['graph']:.0f} | {opened} "
                      f"| {size:.1f} MiB |")  # fmt: skip
            browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
