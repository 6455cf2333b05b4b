"""HTML pages through the real app (TestClient, SQLite): what each page shows, escaping,
search and pagination, and the view-model figures computed by hand."""

from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient
from pages_data import MIB, small_report, synthetic_report
from pages_server import insert_job, make_settings

from server.app import create_app
from server.db import make_engine, make_session_factory
from server.pages import compare_view, max_batch_rows, numeric_issues, script_json, summary_cards

XSS_NAME = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("pages"))
    factory = make_session_factory(make_engine(settings.database_url))
    with TestClient(create_app(settings)) as client:
        yield client, factory


def add(site, report, **kwargs) -> str:
    return insert_job(site[1], report, **kwargs)


def test_summary_cards_show_the_report_figures():
    cards = {c["label"]: c for c in summary_cards(small_report(), module_count=3)}
    assert cards["Parameters"]["value"] == "676"  # fc1 16*32+32 = 544, fc2 32*4+4 = 132
    assert cards["Forward FLOPs"]["value"] == "10.24K"  # 2*8*16*32 + 2*8*32*4 = 10240
    assert cards["Training-step peak"]["value"] == "4.00 MiB"
    assert cards["Capture"]["detail"] == "5 nodes · 3 modules"


def test_max_batch_rows_sorted_by_budget():
    rows = max_batch_rows(small_report())
    assert rows == [{"budget": "16.00 GiB", "batch": 16}, {"budget": "80.00 GiB", "batch": 80}]


def test_numeric_issues_lists_only_unhealthy_nodes():
    nodes = [n.model_dump() for n in small_report().nodes]
    assert numeric_issues(nodes) == [{"node": "relu", "problems": "50% dead"}]


def test_script_json_cannot_close_the_script_tag():
    text = json.dumps({"name": "</script><b>&'"})
    safe = str(script_json(text))
    assert "<" not in safe and ">" not in safe and "&" not in safe and "'" not in safe
    assert json.loads(safe) == {"name": "</script><b>&'"}


def test_compare_view_deltas_by_hand():
    a = small_report()  # params 676, flops 10240, train peak 4 MiB
    b = small_report(params=1500, flops=30_000, train_peak=6 * MIB)
    rows = {r["key"]: r for r in compare_view(a, b)["summary"]}
    assert rows["params"]["delta"] == "+824"  # 1500 - 676
    assert rows["params"]["percent"] == "+121.9%"  # 824 / 676 = 1.2189
    assert rows["params"]["direction"] == "up"
    assert rows["train_peak_bytes"]["delta"] == "+2.00 MiB"  # 6 MiB - 4 MiB
    assert rows["train_peak_bytes"]["percent"] == "+50.0%"  # 2 / 4
    assert rows["flops_forward"]["percent"] == "+193.0%"  # (30000 - 10240) / 10240
    assert rows["saved_activation_bytes"]["direction"] == "same"


def test_done_report_page(site):
    slug = add(site, small_report(), name="mlp baseline", tags={"branch": "main"})
    html = site[0].get(f"/r/{slug}").text
    assert "mlp baseline" in html and "branch=main" in html
    assert "676" in html and "4.00 MiB" in html
    assert 'data-where="relu"' in html  # the finding links to its node
    assert "dead-relu" in html and "Lower the learning rate" in html
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    assert json.loads(data.group(1))["totals"]["params"] == 676


def test_model_name_with_script_renders_as_text(site):
    slug = add(site, small_report(), name=XSS_NAME)
    for path in (f"/r/{slug}", "/", "/reports"):
        html = site[0].get(path).text
        assert "<script>window.__xss" not in html and "<img src=x" not in html
        assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in html


def test_failed_report_shows_error_traceback_and_rerun(site):
    error = {
        "kind": "user_error",
        "message": "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x16 and 32x4)",
        "stage": "capture",
        "traceback": '  File "model.py", line 12, in forward\n    return self.fc2(x)\n',
    }
    slug = add(site, None, name="broken", status="failed", error_json=error)
    html = site[0].get(f"/r/{slug}").text
    assert "mat1 and mat2 shapes cannot be multiplied" in html
    assert "during <strong>capture</strong>" in html
    assert "File &#34;model.py&#34;, line 12" in html
    assert 'id="rerun"' in html and "fix it and upload again" in html


def test_timed_out_without_error_json_still_explains(site):
    slug = add(site, None, name="slow", status="timed_out", error_message="ran past 600 s")
    html = site[0].get(f"/r/{slug}").text
    assert "ran past 600 s" in html and "time limit" in html


def test_running_report_shows_progress(site):
    slug = add(site, None, name="busy", status="running", stage="memory", progress=40)
    html = site[0].get(f"/r/{slug}").text
    assert 'id="job-stage">memory<' in html and "40%" in html
    assert "progress.js" in html


def test_unknown_report_and_bad_compare_are_404_pages(site):
    client = site[0]
    response = client.get("/r/no-such-slug")
    assert response.status_code == 404 and "No such report" in response.text
    assert client.get("/compare/no-dots").status_code == 404
    done = add(site, small_report(), name="x")
    failed = add(site, None, name="y", status="failed")
    assert client.get(f"/compare/{done}..{failed}").status_code == 404


def test_compare_page_shows_deltas(site):
    a = add(site, small_report(), name="base")
    b = add(site, small_report(params=1500, flops=30_000, train_peak=6 * MIB), name="wider")
    html = site[0].get(f"/compare/{a}..{b}").text
    row = re.search(r'<tr data-key="params".*?</tr>', html, re.S).group(0)
    assert "676" in row and "1,500" in row and "+824" in row and "+121.9%" in row
    assert f"/compare/{b}..{a}" in html  # the swap link


def test_reports_search_status_and_pages(tmp_path):
    settings = make_settings(tmp_path)
    factory = make_session_factory(make_engine(settings.database_url))
    for i in range(30):
        insert_job(factory, small_report(), name=f"run {i:02d}", tags={"branch": f"b{i % 3}"})
    insert_job(factory, None, name="crashed", status="failed")
    with TestClient(create_app(settings)) as client:
        first = client.get("/reports").text
        assert "31 reports" in first and "crashed" in first and "Page 1 of 2" in first
        assert "run 05" not in first  # newest first: 25 per page = crashed + runs 29..06
        assert "run 05" in client.get("/reports?page=2").text
        tagged = client.get("/reports", params={"q": "branch=b1"}).text
        assert "10 reports" in tagged  # i % 3 == 1 for 10 of 0..29
        assert "1 report " in client.get("/reports?status=failed").text
        assert "No report matches" in client.get("/reports?q=nothing-like-this").text


def test_upload_page_lists_recent_and_serves_assets(site):
    add(site, small_report(), name="recent one")
    client = site[0]
    html = client.get("/").text
    assert 'id="upload-form"' in html and "recent one" in html
    for asset in (
        "/static/js/upload.js",
        "/static/vendor/tabulator/tabulator.min.js",
        "/static/vendor/plotly/plotly-basic.min.js",
        "/static/css/app.css",
    ):
        assert client.get(asset).status_code == 200, asset


def test_large_report_page_renders(site):
    slug = add(site, synthetic_report(1000), name="big")
    response = site[0].get(f"/r/{slug}")
    assert response.status_code == 200
    assert "1002 nodes · 1002 modules" in response.text  # 200 blocks of 5 + input + output
    card = re.search(r"Training-step peak</div>\s*<div class=\"card-value\">(.*?)<", response.text)
    assert card.group(1) == "3.00 GiB"  # 3 * GIB, formatted


def test_listing_needs_an_identity_when_auth_is_on(tmp_path):
    from fastapi.testclient import TestClient
    from pages_data import small_report
    from pages_server import insert_job, make_settings

    from server.app import create_app

    settings = make_settings(
        tmp_path / "data", auth="token", trusted_identity_header="X-Forwarded-User"
    )
    app = create_app(settings)
    slug = insert_job(app.state.session_factory, small_report(), name="secret-model")
    other = insert_job(app.state.session_factory, small_report(), name="other-model")
    client = TestClient(app)
    assert client.get("/reports").status_code == 401
    assert "secret-model" not in client.get("/").text
    page = client.get(f"/r/{slug}")
    assert page.status_code == 200  # a report stays readable by its link
    assert other not in page.text  # but the compare picker does not list the others
    signed_in = {"X-Forwarded-User": "ada"}
    assert "secret-model" in client.get("/reports", headers=signed_in).text
    assert "secret-model" in client.get("/", headers=signed_in).text
    assert other in client.get(f"/r/{slug}", headers=signed_in).text


def test_training_setups_table(tmp_path):
    from fastapi.testclient import TestClient
    from pages_data import small_report
    from pages_server import insert_job, make_settings

    from inspector.report import SetupEstimate
    from server.app import create_app

    report = small_report()
    report.memory.setups = [
        SetupEstimate(optimizer="adamw", activation_dtype="float32", measured=True,
                      train_peak_bytes=3 * 2**20, optimizer_bytes=2**20),
        SetupEstimate(optimizer="sgd", activation_dtype="bf16", checkpointing=True,
                      train_peak_bytes=2**20),
    ]  # fmt: skip
    app = create_app(make_settings(tmp_path / "data"))
    slug = insert_job(app.state.session_factory, report, name="setups")
    html = TestClient(app).get(f"/r/{slug}").text
    table = html.split('<table class="setups">', 1)[1].split("</table>", 1)[0]
    rows = table.split("<tr")[2:]  # the header row first
    assert "adamw" in rows[0] and "3.00 MiB" in rows[0] and "(run)" in rows[0]
    assert "sgd" in rows[1] and "every block" in rows[1] and "1.00 MiB" in rows[1]
