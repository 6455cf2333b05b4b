"""The pages in Debian's Chromium (Playwright): table sorting, filtering and the tree,
findings that land on their row, charts drawn, compare deltas, escaping, the upload form.

One browser and one live server for the module; reports go straight into the database.
Screenshots go to tests/artifacts/ (git-ignored)."""

from __future__ import annotations

import io
import zipfile

import pytest
from browser_support import ARTIFACTS
from pages_data import MIB, small_report, synthetic_report
from pages_server import live_server, make_settings

pytestmark = pytest.mark.browser
playwright = pytest.importorskip("playwright.sync_api")

XSS_NAME = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'
MLP = b"""import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def build():
    return Net()
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with live_server(make_settings(tmp_path_factory.mktemp("browser"))) as srv:
        yield srv


def open_report(page, server, slug: str) -> None:
    page.goto(f"{server.url}/r/{slug}")
    page.wait_for_selector("body[data-ready='1']", state="attached", timeout=20_000)


def column(page, field: str) -> list[str]:
    """The visible cells of a column in the table on show, top to bottom."""
    sel = f"#layer-table > div:not([style*='none']) .tabulator-row [tabulator-field='{field}']"
    return [t.strip() for t in page.locator(sel).all_inner_texts()]


@pytest.fixture(scope="module")
def small_slug(server):
    return server.insert(small_report(), name="tiny mlp", tags={"branch": "main"})


def test_sort_and_filter_the_node_table(page, server, small_slug):
    open_report(page, server, small_slug)
    page.click("#view-nodes")
    page.wait_for_function("document.querySelectorAll('#table-nodes .tabulator-row').length == 5")
    assert column(page, "name") == ["x", "fc1", "relu", "fc2", "output"]
    header = page.locator("#table-nodes .tabulator-col[tabulator-field='flops']")
    header.click()  # ascending: the three 0-FLOP nodes, then fc2 (2048), then fc1 (8192)
    assert column(page, "name")[-2:] == ["fc2", "fc1"]
    header.click()  # descending
    assert column(page, "name")[:2] == ["fc1", "fc2"]
    page.fill("#table-search", "linear")
    page.wait_for_function("document.querySelectorAll('#table-nodes .tabulator-row').length == 2")
    assert sorted(column(page, "name")) == ["fc1", "fc2"]
    page.fill("#table-search", "")
    op_filter = page.locator("#table-nodes .tabulator-col[tabulator-field='op'] input")
    op_filter.press_sequentially("call_func")
    page.wait_for_function("document.querySelectorAll('#table-nodes .tabulator-row').length == 1")
    assert column(page, "name") == ["relu"]


def test_expand_and_collapse_the_module_tree(page, server):
    slug = server.insert(synthetic_report(50), name="stack of 10 blocks")
    open_report(page, server, slug)
    # Open at start: the root, `layers`, and its 10 alike blocks folded into one row.
    assert column(page, "label") == ["(root)", "layers", "Block × 10"]
    fold = page.locator("#table-modules .tabulator-row", has_text="Block × 10")
    fold.locator(".tabulator-data-tree-control").click()
    assert column(page, "label") == ["(root)", "layers", "Block × 10"] + [str(i) for i in range(10)]
    block = page.locator("#table-modules .tabulator-row", has_text="Block").nth(4)  # after the fold
    block.locator(".tabulator-data-tree-control").click()
    labels = column(page, "label")
    assert labels[6:11] == ["3", "norm", "fc1", "act", "fc2"]  # layers.3 and its 4 children
    block.locator(".tabulator-data-tree-control").click()
    assert len(column(page, "label")) == 13
    page.fill("#table-search", "layers.7.fc2")
    page.wait_for_function("document.querySelectorAll('#table-modules .tabulator-row').length == 5")
    # the match and its ancestors, the fold among them
    assert column(page, "label") == ["(root)", "layers", "Block × 10", "7", "fc2"]


def test_finding_jumps_to_its_row(page, server):
    slug = server.insert(synthetic_report(500), name="100 blocks")  # finding at layers.99.fc1
    open_report(page, server, slug)
    page.click(".finding[data-where='layers.99.fc1']")
    page.wait_for_function(
        "MGIReport.tables.modules.getSelectedData().map(r => r.path).join() == 'layers.99.fc1'"
    )
    row = page.locator("#table-modules .tabulator-row.tabulator-selected")
    assert row.is_visible()
    box, holder = row.bounding_box(), page.locator("#table-modules .tabulator-tableholder")
    hbox = holder.bounding_box()
    assert hbox["y"] <= box["y"] and box["y"] + box["height"] <= hbox["y"] + hbox["height"]


def test_node_finding_switches_to_the_node_table(page, server, small_slug):
    open_report(page, server, small_slug)
    page.click(".finding[data-where='relu']")
    page.wait_for_function("(MGIReport.tables.nodes?.getSelectedData() || []).length == 1")
    assert page.evaluate("MGIReport.tables.nodes.getSelectedData()[0].name") == "relu"
    assert page.locator("#view-nodes.active").count() == 1


def test_charts_have_data_and_screenshot(page, server):
    slug = server.insert(synthetic_report(1000), name="report for the screenshot")
    open_report(page, server, slug)
    for chart in ("chart-saved", "chart-timeline", "chart-batch", "chart-grads"):
        traces = page.evaluate(f"(document.getElementById('{chart}').data || []).length")
        assert traces >= 1, chart
    # The peak marker sits on the timeline's highest point: 1002 nodes -> 1002 MiB at step 1002.
    peak = page.evaluate(
        "document.getElementById('chart-timeline').data.find(t => t.name === 'peak').x[0]"
    )
    assert peak == 1002
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "report.png", full_page=True)


def test_compare_page_deltas(page, server):
    a = server.insert(small_report(), name="base")
    b = server.insert(small_report(params=1500, flops=30_000, train_peak=6 * MIB), name="wider")
    page.goto(f"{server.url}/compare/{a}..{b}")
    page.wait_for_selector("body[data-ready='1']", state="attached")

    def cells(key: str) -> list[str]:
        return page.locator(f"tr[data-key='{key}'] td").all_inner_texts()

    assert cells("params") == ["Parameters", "676", "1,500", "▲ +824", "+121.9%"]  # 824/676
    assert cells("train_peak_bytes")[3:] == ["▲ +2.00 MiB", "+50.0%"]  # 4 MiB -> 6 MiB
    assert cells("forward_peak_bytes")[3:] == ["0", "+0.0%"]
    assert page.evaluate("document.getElementById('chart-compare-grads').data.length") == 2
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "compare.png", full_page=True)


def test_compare_picker_from_a_report(page, server, small_slug):
    other = server.insert(small_report(params=700), name="other")
    open_report(page, server, small_slug)
    page.fill("#compare-with", f"{server.url}/r/{other}")
    page.click("#compare-form button")
    page.wait_for_url(f"**/compare/{small_slug}..{other}")


def test_script_in_a_model_name_is_text(page, server):
    slug = server.insert(small_report(), name=XSS_NAME)
    open_report(page, server, slug)
    assert page.inner_text("#report-name") == XSS_NAME
    page.goto(f"{server.url}/reports")
    assert page.evaluate("window.__xss === undefined")
    assert page.locator("a.job-name", has_text="<script>").count() >= 1


def test_upload_form_picks_entrypoints_and_checks_the_spec(page, server):
    page.goto(f"{server.url}/")
    page.set_input_files("#model-file", {"name": "model.py", "mimeType": "text/x-python",
                                         "buffer": MLP})  # fmt: skip
    page.wait_for_function("document.getElementById('entrypoint').value === 'model.py:Net'")
    options = page.locator("#entry-select option").all_inner_texts()
    assert options[1:] == ["model.py:Net", "model.py:build"]
    page.fill("#input-spec", '{"x": {"shape": ["B", 8]}')  # missing a brace
    assert page.inner_text("#spec-status").startswith("Not valid JSON")
    page.click("#submit")
    assert page.inner_text("#form-error") == "Fix the input spec first."
    page.fill("#input-spec", '{"x": {"shape": ["B", 8]}, "dims": {"B": 2}}')
    assert page.inner_text("#spec-status") == "Valid input spec."


def test_upload_form_lists_entrypoints_inside_a_zip(page, server):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/model.py", MLP)
        z.writestr("README.md", "not python")
    page.goto(f"{server.url}/")
    page.set_input_files("#model-file", {"name": "pkg.zip", "mimeType": "application/zip",
                                         "buffer": buffer.getvalue()})  # fmt: skip
    page.wait_for_function("document.getElementById('entrypoint').value === 'pkg/model.py:Net'")
    assert "2 Python files" in page.inner_text("#entry-hint")


def test_upload_form_sends_the_chosen_options(browser, tmp_path):
    from sqlalchemy import select

    from inspector.schema.options import DEFAULT_OPTIMIZER, OPTIMIZERS
    from server.models import Job

    # Trusted-only, no sandbox: the upload is accepted and queued; no worker runs it.
    settings = make_settings(tmp_path, sandbox="none", trusted_only=True, device="cpu")
    with live_server(settings) as srv:
        page = browser.new_page()
        page.goto(f"{srv.url}/")
        choices = page.locator("#opt-optimizer option").evaluate_all("os => os.map(o => o.value)")
        assert choices == list(OPTIMIZERS)
        assert page.input_value("#opt-optimizer") == DEFAULT_OPTIMIZER
        assert page.input_value("#opt-device") == "cpu"  # the server's default device
        page.select_option("#preset", "gpt2")
        page.select_option("#opt-optimizer", "sgd")
        page.select_option("#opt-dtype", "bf16")
        page.select_option("#opt-export", "none")
        page.select_option("#opt-serving", "on")
        page.check("#opt-fake")
        page.fill("#opt-budget", "24GiB, 80GiB")
        page.click("#submit")
        page.wait_for_url("**/r/*")
        slug = page.url.rsplit("/", 1)[1]
        page.close()
        with srv.factory() as session:
            options = session.scalar(select(Job.options).where(Job.slug == slug))
    assert options == {
        "optimizer": "sgd", "dtype": "bf16", "device": "cpu", "export": "none", "fake": True,
        "budgets_bytes": [24 * 1024**3, 80 * 1024**3], "serving": True, "compile": "fast",
    }  # fmt: skip


@pytest.mark.slow
def test_upload_through_the_page_and_wait_for_the_report(browser, tmp_path):
    from server.sandbox import sandbox_available
    from server.worker import start_embedded_worker

    # The real sandbox where this machine has one; else the operator's trusted-only mode.
    extra = {} if sandbox_available()[0] else {"sandbox": "none", "trusted_only": True}
    settings = make_settings(tmp_path, **extra)
    worker = start_embedded_worker(settings)
    try:
        with live_server(settings) as srv:
            page = browser.new_page()
            page.goto(f"{srv.url}/")
            page.set_input_files("#model-file", {"name": "model.py", "mimeType": "text/x-python",
                                                 "buffer": MLP})  # fmt: skip
            page.wait_for_function("document.getElementById('entrypoint').value")
            page.fill("#input-spec", '{"x": {"shape": ["B", 8]}, "dims": {"B": 2}}')
            page.fill("#name", "uploaded mlp")
            page.click("#submit")
            page.wait_for_url("**/r/*")
            page.wait_for_selector("body[data-ready='1']", state="attached", timeout=180_000)
            # fc1 8*16+16 = 144, fc2 16*4+4 = 68: 212 parameters
            card = page.locator(".card", has_text="Parameters").locator(".card-value")
            assert card.inner_text() == "212"
            page.close()
    finally:
        worker.stop()
