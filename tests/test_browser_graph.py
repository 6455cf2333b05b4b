"""The graph view in Debian's Chromium: real ResNet-18 and GPT-2 reports (made once here with
the library) start as their stages / blocks, a module opens on double-click with tensor shapes
on its edges, a click selects the table row and a row's "show" finds the node, colour-by,
PNG/SVG export, hook captures chained in call order, a 5,000-node report starting collapsed,
and the compare page's marks. Screenshots go to tests/artifacts/ (git-ignored)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from browser_support import ARTIFACTS
from pages_data import small_report, synthetic_report
from pages_server import live_server, make_settings

from inspector.report import Capture, Node, Report, TensorInfo

pytestmark = pytest.mark.browser
playwright = pytest.importorskip("playwright.sync_api")

MODELS = Path(__file__).parent / "models.py"
# Only the passes the graph shows (export readiness alone costs ~30 s on GPT-2).
PASSES = {"graph", "memory", "gradients", "findings"}
GPT2 = """from transformers import GPT2Config, GPT2LMHeadModel


def build():
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64)
    return GPT2LMHeadModel(config).eval()
"""


def _inspect(model: str, spec: dict) -> Report:
    from inspector.analyze import inspect_model
    from inspector.context import Options

    return inspect_model(model, json.dumps(spec), Options(passes=set(PASSES)))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with live_server(make_settings(tmp_path_factory.mktemp("graph"))) as srv:
        yield srv


@pytest.fixture(scope="module")
def resnet_slug(server):
    # Batch 2: BatchNorm in training mode needs more than one value per channel at layer4 (1x1).
    report = _inspect(f"{MODELS}:ResNet18", {"x": {"shape": ["B", 3, 32, 32]}, "dims": {"B": 2}})
    return server.insert(report, name="resnet-18")


@pytest.fixture(scope="module")
def gpt2_slug(server, tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2") / "gpt2_small.py"
    path.write_text(GPT2)
    spec = {
        "input_ids": {"shape": ["B", "S"], "dtype": "int64", "high": 128},
        "dims": {"B": 1, "S": 8},
    }
    return server.insert(_inspect(f"{path}:build", spec), name="gpt-2 2 layers")


# --- helpers ------------------------------------------------------------------------------------

G = "document.getElementById('report-graph').mgiGraph"


def open_graph(page, server, slug: str) -> None:
    page.goto(f"{server.url}/r/{slug}")
    page.wait_for_selector("#report-graph[data-graph-ready='1']", state="attached", timeout=30_000)
    page.locator("#graph").scroll_into_view_if_needed()


def items(page, kind: str, graph: str = G) -> list[str]:
    """Titles of the visible items of a kind (node, box, group)."""
    return page.evaluate(
        f"{graph}.state.view.items.filter(i => i.kind === '{kind}').map(i => i.title)"
    )


def edge_labels(page, graph: str = G) -> list[str]:
    return page.evaluate(f"{graph}.state.view.edges.map(e => e.label)")


def item_id(page, title: str, graph: str = G) -> str:
    return page.evaluate(f"{graph}.state.view.items.find(i => i.title === {json.dumps(title)}).id")


def click_item(
    page, element_id: str, *, double: bool = False, graph: str = G, root: str = "report-graph"
):
    """Centre the item in the canvas, then click it with the mouse where it is drawn."""
    pos = page.evaluate(
        f"""(id) => {{ const cy = {graph}.state.cy; const el = cy.getElementById(id);
        cy.center(el); const p = el.renderedPosition();
        // An open module is hit on its title band, not at its centre (where its nodes are).
        const top = el.renderedBoundingBox().y1 + 12;
        return el.data('kind') === 'group' ? {{ x: p.x, y: top }} : p; }}""",
        element_id,
    )
    # cytoscape hit-tests what it has drawn: let it draw the centred view before clicking
    page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    box = page.locator(f"#{root} [data-role='canvas']").bounding_box()
    x, y = box["x"] + pos["x"], box["y"] + pos["y"]
    page.mouse.dblclick(x, y) if double else page.mouse.click(x, y)


def wait_layouts(page, count: int, graph: str = G) -> None:
    page.wait_for_function(f"{graph}.state.layouts >= {count}", timeout=20_000)


def shot(page, name: str, selector: str = "#report-graph") -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(selector).screenshot(path=ARTIFACTS / name)


# --- report page --------------------------------------------------------------------------------


def test_resnet_opens_as_stages_and_a_block_shows_its_nodes(page, server, resnet_slug):
    open_graph(page, server, resnet_slug)
    assert items(page, "box") == ["layer1", "layer2", "layer3", "layer4"]
    assert items(page, "node")[:5] == ["x", "conv1", "bn1", "relu", "maxpool"]
    labels = edge_labels(page)
    # 32 -> conv1 (7x7, stride 2, pad 3): (32 + 6 - 7) // 2 + 1 = 16 -> maxpool (3, 2, 1): 8
    assert "[B, 64, 16, 16] f32" in labels and "[B, 64, 8, 8] f32" in labels
    # Stage outputs crossing the box boundaries: 8 -> 4 -> 2 -> 1 as the channels double.
    assert {"[B, 128, 4, 4] f32", "[B, 256, 2, 2] f32", "[B, 512, 1, 1] f32"} <= set(labels)
    shot(page, "graph-resnet18.png")

    click_item(page, item_id(page, "layer2"), double=True)
    wait_layouts(page, 2)
    assert items(page, "box")[1:3] == ["layer2.0", "layer2.1"]
    click_item(page, item_id(page, "layer2.0"), double=True)
    wait_layouts(page, 3)
    inside = page.evaluate(
        f"{G}.state.view.items.filter(i => i.parent === 'm:layer2.0').map(i => i.title)"
    )
    # Forward order: the skip path's downsample (a Sequential of 2: one box) runs first.
    assert inside == ["downsample", "conv1", "bn1", "relu", "conv2", "bn2", "add_2", "relu"]
    # The first conv of layer2 has stride 2: 8 -> 4 with 128 channels; the skip path too.
    assert edge_labels(page).count("[B, 128, 4, 4] f32") >= 5
    shot(page, "graph-resnet18-layer2-open.png")


def test_clicking_a_node_selects_its_row_and_a_row_finds_its_node(page, server, resnet_slug):
    open_graph(page, server, resnet_slug)
    click_item(page, item_id(page, "fc"))
    page.wait_for_function("(MGIReport.tables.nodes?.getSelectedData() || []).length == 1")
    assert page.evaluate("MGIReport.tables.nodes.getSelectedData()[0].name") == "fc"
    assert page.inner_text("#report-graph [data-role='info']").startswith("Node\tfc")

    page.click("#view-modules")
    page.evaluate("MGIReport.focusWhere('layer3.1.conv2')")
    page.wait_for_function(
        "MGIReport.tables.modules.getSelectedData().map(r => r.path).join() == 'layer3.1.conv2'"
    )
    page.locator("#table-modules .tabulator-row.tabulator-selected .to-graph").click()
    # fx's name for the call of layer3.1.conv2
    page.wait_for_function(f"{G}.state.cy.$(':selected').data('item')?.where == 'layer3_1_conv2'")
    assert page.evaluate(f"{G}.state.cy.$(':selected').length") == 1
    assert page.evaluate(f"[...{G}.state.expanded].sort()") == ["layer3", "layer3.1"]


def test_colour_by_switches_the_fills_and_the_legend(page, server, resnet_slug):
    open_graph(page, server, resnet_slug)

    def fill(title: str) -> str:
        return page.evaluate(f"{G}.state.cy.getElementById('{item_id(page, title)}').data('fill')")

    assert fill("conv1") == fill("relu") == "#ffffff"  # by node kind
    page.select_option("#report-graph [data-role='measure']", "flops")
    assert "Forward FLOPs" in page.inner_text("#report-graph [data-role='legend']")
    assert fill("relu") == "rgb(241,247,255)"  # ReLU: 0 FLOPs, the light end of the ramp
    assert fill("conv1") != fill("relu")
    page.select_option("#report-graph [data-role='measure']", "saved")
    assert "Saved activation bytes" in page.inner_text("#report-graph [data-role='legend']")
    shot(page, "graph-resnet18-saved.png")


def test_gpt2_opens_as_its_blocks(page, server, gpt2_slug):
    open_graph(page, server, gpt2_slug)
    # The two blocks are alike (inspector.repeats): one box until it is opened.
    assert items(page, "box") == ["GPT2Block × 2"]
    assert items(page, "group") == ["transformer · GPT2Model", "h · ModuleList"]
    assert "[B, S, 64] f32" in edge_labels(page)  # symbolic dims on the edges
    shot(page, "graph-gpt2.png")
    click_item(page, item_id(page, "GPT2Block × 2"), double=True)
    wait_layouts(page, 2)
    # Its row is selected too (the table above grows: wait before aiming the next click).
    page.wait_for_function(
        "MGIReport.tables.modules.getSelectedData().map(r => r.path).join() == 'transformer.h.0..1'"
    )
    page.wait_for_selector("#table-modules .tabulator-row.tabulator-selected")
    assert items(page, "box") == ["h.0", "h.1"]
    assert items(page, "group")[-1] == "h.0–1 · GPT2Block × 2"
    click_item(page, item_id(page, "h.0"), double=True)
    wait_layouts(page, 3)
    assert {"ln_1", "attn", "ln_2", "mlp"} <= set(items(page, "box") + items(page, "node"))
    assert "[B, S, 64] f32" in edge_labels(page)
    shot(page, "graph-gpt2-block-open.png")


def test_export_png_and_svg(page, server, resnet_slug):
    open_graph(page, server, resnet_slug)
    with page.expect_download() as png:
        page.click("#report-graph [data-role='png']")
    data = Path(png.value.path()).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000
    with page.expect_download() as svg:
        page.click("#report-graph [data-role='svg']")
    text = Path(svg.value.path()).read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert ">layer1</tspan>" not in text and "▸ layer1" in text  # the collapsed stage box
    # 13 visible items in a chain: 12 edges, plus the arrow marker's own path.
    assert text.count("<path d=") == 13
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "graph-resnet18.svg").write_text(text)
    assert svg.value.suggested_filename == f"graph-{resnet_slug}.svg"


def _hooks_report() -> Report:
    """A hook capture: module calls (root first, pre-order), no producer links."""
    t = TensorInfo(shape=[4, 8], sym_shape=["B", 8], dtype="float32", bytes=128)
    calls = [("model", "", "Net"), ("enc", "enc", "Sequential"), ("enc.0", "enc.0", "Linear"),
             ("enc.1", "enc.1", "ReLU"), ("head", "head", "Linear")]  # fmt: skip
    nodes = [
        Node(id=i, name=name, op="module", target=kind, module_path=path, module_type=kind,
             output_tensors=[t])
        for i, (name, path, kind) in enumerate(calls)
    ]  # fmt: skip
    return Report(capture=Capture(method="hooks", node_count=len(nodes)), nodes=nodes)


def test_hook_capture_is_chained_in_call_order(page, server):
    open_graph(page, server, server.insert(_hooks_report(), name="hooks"))
    # The root's and enc's own calls are drawn as the graph and enc's frame; enc holds 2 of
    # the 3 leaf calls, so it starts open. No producer links: calls follow each other.
    assert items(page, "group") == ["enc · Sequential"]
    assert items(page, "node") == ["enc.0", "enc.1", "head"]
    edges = page.evaluate(f"{G}.state.view.edges.map(e => [e.source, e.target, e.label])")
    assert edges == [["n:2", "n:3", "[B, 8] f32"], ["n:3", "n:4", "[B, 8] f32"]]
    click_item(page, "m:enc", double=True)  # double-click an open module: close it
    wait_layouts(page, 2)
    assert items(page, "box") == ["enc"]
    edges = page.evaluate(f"{G}.state.view.edges.map(e => [e.source, e.target])")
    assert edges == [["m:enc", "n:4"]]


def test_5000_nodes_start_collapsed(page, server):
    open_graph(page, server, server.insert(synthetic_report(5000), name="5000 nodes"))
    # 1,000 alike blocks of 5 nodes in one ModuleList: one folded box, which stays closed.
    assert items(page, "box") == ["Block × 1000"]
    assert items(page, "group") == ["layers · ModuleList"]
    assert items(page, "node") == ["x", "output"]
    assert page.inner_text("#report-graph [data-role='status']").startswith("5002 nodes")
    page.fill("#report-graph [data-role='search']", "layers.999.fc2")
    page.press("#report-graph [data-role='search']", "Enter")
    wait_layouts(page, 2)
    assert page.evaluate(f"{G}.state.cy.$(':selected').data('item').where") == "layers_999_fc2"
    assert page.evaluate(f"{G}.state.view.items.filter(i => i.kind === 'box').length") == 999


def _variant() -> Report:
    """small_report with fc2 widened (4 -> 8 outputs), relu gone and an fc3 added."""
    report = small_report()
    nodes = {n.name: n for n in report.nodes}
    wide = TensorInfo(shape=[8, 8], sym_shape=["B", 8], dtype="float32", bytes=256)
    nodes["fc2"].output_tensors = [wide]
    nodes["fc2"].inputs = [1]
    fc3 = Node(id=5, name="fc3", op="call_module", target="fc3", module_path="fc3",
               module_type="Linear", inputs=[3], output_tensors=[wide])  # fmt: skip
    nodes["output"].inputs = [5]
    report.nodes = [n for n in report.nodes if n.name != "relu"] + [fc3]
    return report


def test_compare_marks_added_removed_changed(page, server):
    a = server.insert(small_report(), name="base")
    b = server.insert(_variant(), name="variant")
    page.goto(f"{server.url}/compare/{a}..{b}")
    page.wait_for_selector("body[data-graphs-ready='1']", state="attached", timeout=30_000)

    def marks(side: str) -> dict[str, str]:
        return page.evaluate(
            f"""Object.fromEntries([...document.getElementById('graph-{side}').mgiGraph.state.marks]
            .map(([id, m]) => [document.getElementById('graph-{side}').mgiGraph.state.cy
            .getElementById(id).data('item').where, m]))"""
        )

    assert marks("a") == {"relu": "removed", "fc2": "changed"}
    assert marks("b") == {"fc2": "changed", "fc3": "added"}
    assert page.evaluate(
        "document.getElementById('graph-b').mgiGraph.state.cy.$('.added').length"
    ) == 1  # fmt: skip
    shot(page, "graph-compare.png", "#compare-graph")
