"""HTML pages through the real app (TestClient, SQLite): what each page shows, escaping,
search and pagination (the same answers as the API), the library's numeric verdicts, the
upload form's options, and the view-model figures computed by hand."""

from __future__ import annotations

import json
import re
from html import unescape
from types import SimpleNamespace

import pytest
from api_support import BACKENDS, api_env, upload
from fastapi.testclient import TestClient
from pages_data import MIB, small_report, synthetic_report
from pages_server import insert_job, make_settings

from inspector.report import Node, NumericStats
from inspector.schema.options import (
    AUTOCAST_DTYPES,
    COMPILE_LEVELS,
    DEFAULT_COMPILE,
    DEFAULT_DTYPE,
    DEFAULT_EXPORT,
    DEFAULT_OPTIMIZER,
    DEVICES,
    EXPORT_LEVELS,
    OPTIMIZERS,
)
from server.app import create_app
from server.db import make_engine, make_session_factory
from server.pages.compareview import compare_view
from server.pages.rendering import script_json
from server.pages.reportview import (
    max_batch_rows,
    numeric_findings,
    summary_cards,
)
from server.pages.routes import search_filters

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


def test_numeric_findings_are_the_reports_numerics_findings():
    found = numeric_findings(small_report())  # dead-relu at relu; no-bias-before-norm is not
    assert [(f.rule, f.where) for f in found] == [("dead-relu", "relu")]


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


def test_report_page_shows_graph_breaks_with_their_code_lines(site):
    from inspector.report import Compile, GraphBreak, Recompile

    report = small_report()
    report.compile = Compile(
        computed=True, mode="train", graph_count=2, graph_break_count=1, breaks=[
            GraphBreak(reason="Unsupported Tensor.item() call", op="Tensor.item()",
                       where="model.py:12", code="if x.sum().item() > 0: <b>", count=3,
                       hints=["Set capture_scalar_outputs"],
                       url="https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0124.html"),
        ],
        recompiles=[Recompile(dim="B", value=8, changed_to=4, recompiles=1,
                              guards=["forward in model.py:5: tensor 'x' size mismatch"])],
        notes=["Dynamo detected a call to a `functools.lru_cache`-wrapped fn at 'm.py:9' <i>"],
    )  # fmt: skip
    html = site[0].get(f"/r/{add(site, report, name='breaks')}").text
    table = re.search(r'<table class="plain" id="compile-breaks">.*?</table>', html, re.S).group(0)
    assert "<code>model.py:12</code>" in table and "×3" in table
    assert "if x.sum().item() &gt; 0: &lt;b&gt;" in table  # the user's line, escaped
    assert "Unsupported Tensor.item() call" in table and "Hint: Set capture_scalar_outputs" in table
    assert "1 graph break<" in html and "2 graphs" in html
    recompiles = re.search(r'id="compile-recompiles">.*?</table>', html, re.S).group(0)
    assert "8 → 4" in recompiles and "size mismatch" in recompiles
    notes = re.search(r'id="compile-notes">.*?</ul>', html, re.S).group(0)
    assert "Dynamo says: Dynamo detected a call to a `functools.lru_cache`" in notes
    assert "at &#39;m.py:9&#39; &lt;i&gt;" in notes  # torch's text, escaped
    plain = site[0].get(f"/r/{add(site, small_report(), name='unchecked')}").text
    assert "torch.compile readiness was not checked." in plain and "compile-breaks" not in plain
    assert "compile-notes" not in plain


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


def test_compare_page_flags_a_changed_set_up(site):
    a_report, b_report = small_report(), small_report()
    a_report.meta.versions = {"torch": "2.13.0", "python": "3.11.9"}
    b_report.meta.versions = {"torch": "2.14.0", "python": "3.11.9"}
    a_report.meta.options, b_report.meta.options = {"dtype": "float32"}, {"dtype": "fp16"}
    a, b = add(site, a_report, name="old torch"), add(site, b_report, name="new torch")
    html = site[0].get(f"/compare/{a}..{b}").text
    banner = re.search(r'<section class="panel drift" id="setup-drift">.*?</section>', html, re.S)
    rows = re.findall(r'<tr data-key="(\w+)"><td>[^<]*</td><td><code>([^<]*)</code></td>'
                      r'<td><code>([^<]*)</code>', banner.group(0))  # fmt: skip
    assert rows == [("torch", "2.13.0", "2.14.0"), ("dtype", "float32", "fp16")]
    same = add(site, small_report(), name="same")
    assert "setup-drift" not in site[0].get(f"/compare/{same}..{same}").text


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


def test_report_page_carries_the_folds_of_its_blocks(site):
    slug = add(site, synthetic_report(50), name="10 blocks")
    html = site[0].get(f"/r/{slug}").text
    data = json.loads(unescape(re.search(r'id="page-data">(.*?)</script>', html).group(1)))
    [fold] = data["folds"]
    assert fold["id"] == "layers.0..9" and fold["label"] == "Block × 10"
    assert fold["paths"] == [f"layers.{i}" for i in range(10)]
    # A block of width 64: norm 2*64, fc1 64*256 + 256, fc2 256*64 + 64: 33,216 params
    assert fold["per_block"]["params"] == 2 * 64 + 64 * 256 + 256 + 256 * 64 + 64 == 33_216
    assert fold["total"]["params"] == 10 * 33_216
    assert '<script src="/static/js/folds.js"></script>' in html
    assert site[0].get("/static/js/folds.js").status_code == 200


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


# --- the library's numeric verdicts -----------------------------------------------------------


def _library_findings(report, kinds: dict[str, str], stats: dict[str, NumericStats]) -> list:
    """What inspector.rules.numerics finds for these stats, at the library's thresholds."""
    from inspector.context import Options
    from inspector.results import PassResults
    from inspector.rules.numerics import dead_relu

    numerics = SimpleNamespace(computed=True, kinds=kinds, stats=stats, first_nan_node=None)
    ctx = SimpleNamespace(results=PassResults(numerics=numerics), options=Options())
    return list(dead_relu(ctx, report))


def test_health_shows_the_librarys_verdicts_not_every_dead_unit(site):
    from inspector.health.thresholds import DEFAULTS

    limit = DEFAULTS["dead_fraction"]
    low = NumericStats(min=0.0, max=2.0, dead_fraction=limit / 5)  # dead, but under the limit
    high = NumericStats(min=0.0, max=2.0, dead_fraction=0.9)
    report = small_report()
    report.nodes[2].stats = low  # "relu"
    late = Node(id=5, name="late_relu", op="call_function", target="torch.relu", stats=high)
    report.nodes.insert(4, late)
    report.findings = _library_findings(report, {"relu": "relu", "late_relu": "relu"},
                                        {"relu": low, "late_relu": high})  # fmt: skip
    assert [f.where for f in report.findings] == ["late_relu"]  # the library's verdict
    html = site[0].get(f"/r/{add(site, report, name='dead units')}").text
    health = html.split('id="health"', 1)[1].split("</section>", 1)[0]
    assert 'data-where="late_relu"' in health and "dead-relu" in health
    assert "90% of the features after 'late_relu' are zero" in unescape(health)
    assert 'data-where="relu"' not in health  # 10% dead: no problem by the library's measure


def test_health_says_so_when_the_library_found_nothing(site):
    report = small_report()
    report.findings = [f for f in report.findings if f.rule != "dead-relu"]
    html = site[0].get(f"/r/{add(site, report, name='healthy')}").text
    health = html.split('id="health"', 1)[1].split("</section>", 1)[0]
    assert "No numeric findings" in health and "data-where" not in health


# --- the list page answers as the API list ----------------------------------------------------


def test_search_words_become_the_apis_filters():
    assert search_filters("resnet  branch=main wide") == ("resnet wide", {"branch": "main"})
    assert search_filters("branch=main team=vision") == (None, {"branch": "main", "team": "vision"})
    assert search_filters("=main") == ("=main", {})  # no key: a word of the name
    assert search_filters("") == (None, {})


def _page_list(client: TestClient, params: dict) -> tuple[list[str], int]:
    html = client.get("/reports", params=params).text
    slugs = re.findall(r'<a href="/r/([^"]+)" class="job-name">', html)
    total = re.search(r'<p class="sub">(\d+) reports?', html)
    return slugs, int(total.group(1)) if total else 0


def _api_list(client: TestClient, params: dict) -> tuple[list[str], int]:
    body = client.get("/api/v1/reports", params={"limit": 25} | params).json()
    return [item["slug"] for item in body["items"]], body["total"]


SEARCHES = [  # (page query, API query, names expected, newest first)
    ({"q": "resnet"}, {"name": "resnet"}, ["ResNet small", "resnet wide", "resnet base"]),
    ({"q": "branch=main"}, {"tag": "branch=main"}, ["bert base", "ResNet small", "resnet base"]),
    ({"status": "failed"}, {"status": "failed"}, ["ResNet small"]),
    ({"q": "resnet branch=main", "status": "done"},
     {"name": "resnet", "tag": "branch=main", "status": "done"}, ["resnet base"]),
    ({"q": "team=vision branch=dev"}, {"tag": ["team=vision", "branch=dev"]}, ["resnet wide"]),
    ({"q": "100%"}, {"name": "100%"}, ["100% sparse"]),  # % is a character, not a wildcard
    ({"q": "filler", "page": 2}, {"name": "filler", "offset": 25}, ["filler 01", "filler 00"]),
    ({}, {}, [f"filler {i:02d}" for i in range(26, 1, -1)]),  # the newest 25 of 33
]  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_list_page_answers_as_the_api(backend, tmp_path, monkeypatch):
    jobs = [  # name, status, tags; oldest first
        ("resnet base", "done", {"branch": "main", "team": "vision"}),
        ("resnet wide", "done", {"branch": "dev", "team": "vision"}),
        ("ResNet small", "failed", {"branch": "main"}),
        ("bert base", "done", {"branch": "main", "family": "resnet"}),  # "resnet" only a tag
        ("100% sparse", "done", {}),
        ("100 layers", "queued", {}),
    ] + [(f"filler {i:02d}", "done", {"batch": "fill"}) for i in range(27)]
    with api_env(backend, tmp_path, monkeypatch) as env:
        names = {insert_job(env.factory, None, name=n, status=s, tags=t): n for n, s, t in jobs}
        for page_query, api_query, expected in SEARCHES:
            page, api = _page_list(env.client, page_query), _api_list(env.client, api_query)
            assert page == api, (page_query, api_query)
            assert [names[slug] for slug in page[0]] == expected, page_query
    assert api[1] == len(jobs) == 33  # the last search: no filter, 25 of the 33 shown


# --- the upload form's options ------------------------------------------------------------------


def _select(html: str, name: str) -> tuple[list[str], list[str]]:
    """The choices of the upload form's select `name`, and the selected ones."""
    body = re.search(rf'<select id="opt-{name}" name="{name}"[^>]*>(.*?)</select>', html, re.S)
    choices = re.findall(r'<option value="([^"]+)"', body.group(1))
    return choices, re.findall(r'<option value="([^"]+)" selected', body.group(1))


def test_upload_page_offers_the_schema_options(site):
    html = site[0].get("/").text
    assert _select(html, "optimizer") == (list(OPTIMIZERS), [DEFAULT_OPTIMIZER])
    assert _select(html, "dtype") == (list(AUTOCAST_DTYPES), [DEFAULT_DTYPE])
    assert _select(html, "export") == (list(EXPORT_LEVELS), [DEFAULT_EXPORT])
    assert _select(html, "compile") == (list(COMPILE_LEVELS), [DEFAULT_COMPILE])
    assert _select(html, "device") == (list(DEVICES), ["auto"])  # Settings.device's default
    assert 'id="opt-fake" name="fake"' in html and 'id="opt-budget" name="budget"' in html


def test_an_upload_with_the_forms_options_records_them(tmp_path, monkeypatch):
    with api_env("sqlite", tmp_path, monkeypatch, device="cpu") as env:
        assert _select(env.client.get("/").text, "device")[1] == ["cpu"]  # the server's default
        form = {"optimizer": "sgd", "dtype": "bf16", "device": "cpu", "export": "none",
                "compile": "all"}  # fmt: skip
        r = upload(env, data=form | {"fake": "true", "budget": "24GiB"})
        assert r.status_code == 201, r.text
        options = env.job(r.json()["slug"]).options
    assert options == form | {"fake": True, "budgets_bytes": [24 * 1024**3], "serving": None}


def test_export_table_says_where_the_other_targets_are(site):
    from inspector.report import Export, ExportTarget

    fast = small_report()
    fast.export = Export(targets=[ExportTarget(target="export-nonstrict", ok=True)])
    everything = small_report()
    everything.export = Export(
        targets=[ExportTarget(target=t, ok=True) for t in ("export-nonstrict", "export-strict")]
    )
    note = "TorchScript (deprecated by torch) and ONNX are tried with"
    assert note in unescape(site[0].get(f"/r/{add(site, fast, name='fast')}").text)
    assert note not in unescape(site[0].get(f"/r/{add(site, everything, name='all')}").text)
