"""Big models stay readable, in Debian's Chromium: a Llama of 80 alike layers (a real
2-layer report stacked by tests/stacked.py to the 70B preset's 7,718 nodes and 1,047
modules) shows one "LlamaDecoderLayer × 80" box in the graph and one row in the module
table, each opening into the blocks and closing again, and its page is interactive within
the time budget. Screenshots go to tests/artifacts/ (git-ignored)."""

from __future__ import annotations

import statistics

import pytest
from browser_support import ARTIFACTS
from pages_server import live_server, make_settings
from stacked import stack_blocks, tiny_llama_report

from inspector.report import Report

pytestmark = pytest.mark.browser
playwright = pytest.importorskip("playwright.sync_api")

G = "document.getElementById('report-graph').mgiGraph"
FOLD_80, FOLD_12 = "model.layers.0..79", "model.layers.0..11"
# The 70B page's target is 1.5 s from navigation to the table, charts and graph drawn
# (bench/RESULTS.md: the real 70B report 1.4 s with the machine loaded, 0.6 s quiet).
# Asserted with room for a loaded 2-core machine; a page that opened the 80 blocks at
# start did not finish in 30 s here.
TARGET_S = 1.5
LOADED_MACHINE = 2.0


@pytest.fixture(scope="module")
def shallow(tmp_path_factory) -> dict:
    passes = {"graph", "memory", "findings"}  # what the page draws: table, charts, graph
    return tiny_llama_report(tmp_path_factory.mktemp("llama"), 2, passes)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with live_server(make_settings(tmp_path_factory.mktemp("folds"))) as srv:
        yield srv


@pytest.fixture(scope="module")
def slug_80(server, shallow):
    return server.insert(Report.model_validate(stack_blocks(shallow, 80)), name="llama 80")


@pytest.fixture(scope="module")
def slug_12(server, shallow):
    return server.insert(Report.model_validate(stack_blocks(shallow, 12)), name="llama 12")


def open_page(page, server, slug: str) -> None:
    page.goto(f"{server.url}/r/{slug}")
    page.wait_for_selector("body[data-ready='1']", state="attached", timeout=30_000)
    page.wait_for_selector("#report-graph[data-graph-ready='1']", state="attached", timeout=30_000)


def visible(page, kind: str) -> list[dict]:
    return page.evaluate(
        f"{G}.state.view.items.filter(i => i.kind === '{kind}')"
        ".map(i => ({id: i.id, title: i.title, subtitle: i.subtitle || ''}))"
    )


def layouts(page) -> int:
    return page.evaluate(f"{G}.state.layouts")


def double_click(page, element_id: str) -> None:
    """Double-click an item where cytoscape draws it: a box at its centre, an open group on
    its title band (brought into view: an open fold is taller than the canvas)."""
    pos = page.evaluate(
        f"""(id) => {{ const cy = {G}.state.cy; const el = cy.getElementById(id);
        cy.center(el);
        if (el.data('kind') !== 'group') return el.renderedPosition();
        cy.panBy({{ x: 0, y: 30 - el.renderedBoundingBox().y1 }});
        return {{ x: el.renderedPosition().x, y: el.renderedBoundingBox().y1 + 12 }}; }}""",
        element_id,
    )
    page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    box = page.locator("#report-graph [data-role='canvas']").bounding_box()
    before = layouts(page)
    page.mouse.dblclick(box["x"] + pos["x"], box["y"] + pos["y"])
    page.wait_for_function(f"{G}.state.layouts > {before}", timeout=60_000)


def block_nodes(report: dict) -> int:
    """Nodes the graph draws inside the blocks (weights, `get_attr`, are hidden)."""
    return sum(
        (n["module_path"] or "").startswith("model.layers.") and n["op"] != "get_attr"
        for n in report["nodes"]
    )


def test_graph_shows_80_layers_as_one_box(page, server, slug_80, shallow):
    open_page(page, server, slug_80)
    boxes = {b["title"]: b for b in visible(page, "box")}
    fold = boxes["LlamaDecoderLayer × 80"]
    assert fold["id"] == f"m:{FOLD_80}"
    # 92 drawn nodes a block (96 less 4 weights), 80 blocks: 7,360
    assert fold["subtitle"] == f"layers.0–79 · {80 * block_nodes(shallow) // 2} nodes"
    assert fold["subtitle"] == "layers.0–79 · 7360 nodes"  # as the real 70B preset's page says
    assert not any(b["title"].startswith("layers.") for b in visible(page, "box"))
    # The start stays small: what is drawn is laid out in well under a second.
    assert len(visible(page, "box")) + len(visible(page, "node")) <= 60
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#report-graph").screenshot(path=ARTIFACTS / "graph-llama80-folded.png")


def test_a_fold_opens_into_its_blocks_and_closes_again(page, server, slug_12):
    open_page(page, server, slug_12)
    page.locator("#graph").scroll_into_view_if_needed()
    double_click(page, f"m:{FOLD_12}")
    # The fold's row is selected in the table above, which grows: the graph moves down.
    page.wait_for_function(
        f"MGIReport.tables.modules.getSelectedData().map(r => r.path).join() == '{FOLD_12}'"
    )
    groups = [g["title"] for g in visible(page, "group")]
    assert groups[-1] == "layers.0–11 · LlamaDecoderLayer × 12"
    blocks = [b["title"] for b in visible(page, "box") if b["title"].startswith("layers.")]
    assert blocks == [f"layers.{i}" for i in range(12)]
    inside = page.evaluate(
        f"{G}.state.view.items.filter(i => i.parent === 'm:{FOLD_12}').length"
    )  # fmt: skip
    assert inside == 12
    # Each block's output runs into the next one inside the open fold.
    edges = page.evaluate(f"{G}.state.view.edges.map(e => e.source + '>' + e.target)")
    assert "m:model.layers.3>m:model.layers.4" in edges
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#report-graph").screenshot(path=ARTIFACTS / "graph-llama12-open.png")

    double_click(page, f"m:{FOLD_12}")  # the open fold's frame: close it
    titles = [b["title"] for b in visible(page, "box")]
    assert "LlamaDecoderLayer × 12" in titles and "layers.0" not in titles
    assert "Blocks\tlayers.0–11 (12 alike)" in page.inner_text("#report-graph [data-role='info']")


def test_compare_page_folds_both_graphs_and_marks_the_run_that_grew(page, server, shallow):
    """12 blocks against 10: each graph shows its own fold, and the one run of alike blocks
    is marked changed on both sides (not removed on one and added on the other)."""
    a = server.insert(Report.model_validate(stack_blocks(shallow, 12)), name="llama 12")
    b = server.insert(Report.model_validate(stack_blocks(shallow, 10)), name="llama 10")
    page.goto(f"{server.url}/compare/{a}..{b}")
    page.wait_for_selector("body[data-graphs-ready='1']", state="attached", timeout=60_000)
    seen = page.evaluate(
        """() => window.MGICompare.views.map(v => ({
          boxes: v.state.view.items.filter(i => i.kind === 'box').map(i => [i.id, i.title]),
          marks: Object.fromEntries(v.state.marks)}))"""
    )
    folds = [dict((t, i) for i, t in side["boxes"] if "×" in t) for side in seen]
    assert folds[0] == {"LlamaDecoderLayer × 12": f"m:{FOLD_12}"}
    assert folds[1] == {"LlamaDecoderLayer × 10": "m:model.layers.0..9"}
    assert not any(t.startswith("layers.") for side in seen for _, t in side["boxes"])
    assert seen[0]["marks"].get(f"m:{FOLD_12}") == "changed"
    assert seen[1]["marks"].get("m:model.layers.0..9") == "changed"


def fold_row(fold: str) -> str:
    """JS for the fold's row in the module tree (under the root, model, model.layers)."""
    return (
        "MGIReport.tables.modules.getRows()[0].getTreeChildren()[0].getTreeChildren()"
        ".find(r => r.getData().path === 'model.layers').getTreeChildren()"
        f".find(r => r.getData().path === '{fold}')"
    )


def test_module_table_folds_the_blocks_into_one_row(page, server, slug_80, shallow):
    open_page(page, server, slug_80)
    page.evaluate(
        "MGIReport.tables.modules.getRows()[0].getTreeChildren()[0].getTreeChildren()"
        ".find(r => r.getData().path === 'model.layers').treeExpand()"
    )
    row = page.locator("#table-modules .tabulator-row", has_text="LlamaDecoderLayer × 80")
    rows = {m["path"]: m for m in shallow["modules"]}
    block = rows["model.layers.1"]
    # 36,992 params a block (tests/test_stacked.py), 80 blocks: 2,959,360
    assert block["params"] == 36_992
    params = row.locator("[tabulator-field='params']").inner_text().split("\n")
    assert params == ["2.96M", "36.99K each"]
    flops = row.locator("[tabulator-field='flops']").inner_text().split("\n")
    each = block["flops_forward"]
    assert flops == [js_count(80 * each), f"{js_count(each)} each"]
    # The row's numbers are the blocks' sums.
    data = page.evaluate(f"{fold_row(FOLD_80)}.getData()")
    assert data["params"] == 80 * block["params"] == rows["model.layers"]["params"] * 40
    # The first block is the shallow report's own, the other 79 copies of its second.
    saved = rows["model.layers.0"]["saved_activation_bytes"] + 79 * block["saved_activation_bytes"]
    assert data["saved_bytes"] == saved
    children = page.evaluate(
        f"{fold_row(FOLD_80)}.getTreeChildren().map(r => r.getData().path)"
    )  # fmt: skip
    assert children == [f"model.layers.{i}" for i in range(80)]
    assert not page.evaluate(f"{fold_row(FOLD_80)}.isTreeExpanded()")

    row.locator(".tabulator-data-tree-control").click()
    assert page.evaluate(f"{fold_row(FOLD_80)}.isTreeExpanded()")
    page.locator("#layers").screenshot(path=ARTIFACTS / "table-llama80-open.png")
    row.locator(".tabulator-data-tree-control").click()
    assert not page.evaluate(f"{fold_row(FOLD_80)}.isTreeExpanded()")
    # A row inside the fold is found (a finding's link, the graph's "show in table").
    page.evaluate("MGIReport.focusWhere('model.layers.41.mlp')")
    page.wait_for_function(
        "MGIReport.tables.modules.getSelectedData().map(r => r.path).join() == "
        "'model.layers.41.mlp'"
    )


def js_count(n: int) -> str:
    """As MGI.formatCount writes it: two decimals after K, M, G, T (static/js/util.js)."""
    v = float(n)
    for unit in ("", "K", "M", "G", "T"):
        if v < 1000 or unit == "T":
            return f"{v:.0f}" if unit == "" else f"{v:.2f}{unit}"
        v /= 1000
    raise AssertionError


MEASURE = """() => {
  const graph = performance.getEntriesByName('mgi:graph')[0];
  return {ready: window.__reportReady, graph: graph ? graph.startTime : null,
          rows: document.querySelectorAll('#table-modules .tabulator-row').length,
          drawn: document.getElementById('report-graph').mgiGraph.state.cy.nodes().length};
}"""


def test_80_layer_page_is_interactive_within_budget(page, server, slug_80):
    """Navigation start to the table and the four charts drawn and the graph painted."""
    open_page(page, server, slug_80)  # warm-up: the server renders and keeps the page
    runs = []
    for _ in range(3):
        open_page(page, server, slug_80)
        runs.append(page.evaluate(MEASURE))
    assert all(r["rows"] >= 5 and r["drawn"] >= 10 for r in runs), runs  # drawn, not empty
    interactive_s = statistics.median(max(r["ready"], r["graph"]) for r in runs) / 1000
    assert interactive_s < TARGET_S * LOADED_MACHINE, runs
