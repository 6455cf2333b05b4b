"""The fit plan and the distributed figures as people read them: the report page, the
terminal, the PR Markdown, compare (library and page), and `fit` through the API."""

from __future__ import annotations

import io

from api_support import api_env, upload
from fastapi.testclient import TestClient
from pages_data import small_report
from pages_server import insert_job, make_settings
from rich.console import Console
from test_distributed_views import distributed_report

from inspector.compare import compare_reports
from inspector.render.markdown import render_markdown
from inspector.render.terminal import render_terminal
from inspector.report import FitChange, FitPlan, FitTry, GpusNeeded, Report
from server.app import create_app
from server.db import make_engine, make_session_factory

GIB = 1024**3
SNIPPET = "for name in ['layers.0']:\n    block = model.get_submodule(name)"


def fit_report(found: bool = True) -> Report:
    report = small_report(name="mlp")
    report.memory.fit_plan = FitPlan(
        budget_bytes=24 * GIB, found=found, batch=64, micro_batch=16, accumulation_steps=4,
        baseline_peak_bytes=40 * GIB, predicted_peak_bytes=22 * GIB,
        verified_peak_bytes=(23 if found else 30) * GIB, predicted_extra_compute=0.2,
        extra_compute=0.1, recompute_flops=3 * 10**12,
        changes=[FitChange(kind="checkpoint", summary="Checkpoint 1 of 4 blocks (layers.0)",
                           cost="+20.0% compute predicted", risk="none", snippet=SNIPPET,
                           where=["layers.0"])],
        tried=[FitTry(summary="checkpoint 1 block(s)", predicted_peak_bytes=22 * GIB,
                      verified_peak_bytes=23 * GIB, fits=found)],
        notes=[] if found else ["no plan found within these changes: the closest run is shown"],
    )  # fmt: skip
    return report


def test_report_page_shows_the_plan(tmp_path) -> None:
    settings = make_settings(tmp_path)
    factory = make_session_factory(make_engine(settings.database_url))
    with TestClient(create_app(settings)) as client:
        html = client.get(f"/r/{insert_job(factory, fit_report(), name='f')}").text
        missed = client.get(f"/r/{insert_job(factory, fit_report(False), name='m')}").text
        plain = client.get(f"/r/{insert_job(factory, small_report(), name='p')}").text
    section = html.split('id="fit-plan"', 1)[1].split("</section>", 1)[0]
    assert "<strong>Fits</strong>" in section and "predicted 22.00 GiB" in section
    assert "<strong>23.00 GiB</strong>" in section and "Extra compute 10.0%" in section
    assert "for name in [&#39;layers.0&#39;]:" in section  # the snippet, escaped
    assert 'href="#fit-plan"' in html and 'id="fit-plan"' not in plain
    assert "No plan found within these changes" in missed.split('id="fit-plan"', 1)[1]


def test_terminal_fit_section() -> None:
    out = io.StringIO()
    render_terminal(fit_report(), console=Console(file=out, width=200))
    text = out.getvalue()
    assert "Make it fit" in text
    assert "fits 24.00 GiB: predicted 22.00 GiB, verified 23.00 GiB (now 40.00 GiB)" in text
    assert "1. Checkpoint 1 of 4 blocks (layers.0)" in text and "get_submodule" in text


def test_markdown_fit_and_distributed_against_a_baseline() -> None:
    new, old = distributed_report(), distributed_report()
    new.memory.fit_plan = fit_report().memory.fit_plan
    old.distributed.plans[0].per_rank_peak_bytes = 16 * GIB  # 20 GiB now: +4 GiB, +25%
    old.distributed.gpus_needed[1] = GpusNeeded(strategy="fsdp", budget_bytes=80 * GIB, gpus=4)
    text = render_markdown(new, baseline=old)
    assert "**Make it fit:** fits 24.00 GiB: predicted 22.00 GiB, verified 23.00 GiB" in text
    assert "| Heaviest rank, `fsdp:8` | 20.00 GiB | 16.00 GiB | ▲ +4.00 GiB (+25.0%) |" in text
    assert "| GPUs needed, `fsdp` on 80 GiB | 6 | 4 | ▲ +2 (+50.0%) |" in text
    assert "| GPUs needed, `fsdp` on 16 GiB | no fit | no fit | n/a |" in text
    alone = render_markdown(new)
    assert "| Heaviest rank, `fsdp:8` | 20.00 GiB |" in alone


def test_compare_has_the_distributed_deltas(tmp_path) -> None:
    new, old = distributed_report(), distributed_report()
    old.distributed.plans[0].per_rank_peak_bytes = 16 * GIB
    old.distributed.gpus_needed[1] = GpusNeeded(strategy="fsdp", budget_bytes=80 * GIB, gpus=4)
    d = compare_reports(old, new)["distributed"]
    peak = d["plans"][0]
    assert peak["spec"] == "fsdp:8" and peak["per_rank_peak_bytes"]["delta"] == 4 * GIB
    assert peak["per_rank_peak_bytes"]["percent"] == 25.0
    gpus = {g["budget_bytes"]: g["gpus"] for g in d["gpus_needed"]}
    assert gpus[80 * GIB] == {"a": 4, "b": 6, "delta": 2, "percent": 50.0, "direction": "up"}
    assert d["fit_plan"] is None
    settings = make_settings(tmp_path)
    factory = make_session_factory(make_engine(settings.database_url))
    with TestClient(create_app(settings)) as client:
        a, b = insert_job(factory, old, name="a"), insert_job(factory, new, name="b")
        html = client.get(f"/compare/{a}..{b}").text
    row = html.split('data-key="gpus_fsdp_85899345920"', 1)[1].split("</tr>", 1)[0]
    assert "GPUs needed, fsdp on 80.00 GiB" in row and "+2" in row


def test_fit_through_the_api(tmp_path, monkeypatch) -> None:
    with api_env("sqlite", tmp_path, monkeypatch) as env:
        response = upload(env, data={"fit": "24GiB", "fit_batch": "64"})
        assert response.status_code == 201, response.text
        options = env.job(response.json()["slug"]).options
        assert options["fit_bytes"] == 24 * GIB and options["fit_batch"] == 64
        plain = upload(env, data={})
        assert "fit_bytes" not in env.job(plain.json()["slug"]).options
        for data, message in (({"fit": "lots"}, "fit budget: not a size"),
                              ({"fit_batch": "8"}, "give fit too"),
                              ({"fit": "1GiB", "fit_batch": "0"}, "fit batch '0'")):  # fmt: skip
            refused = upload(env, data=data)
            assert refused.status_code == 422 and message in refused.text, refused.text


def test_submit_sends_fit_as_the_api_reads_it() -> None:
    """`inspector submit --fit 24GiB --batch 64` -> the form fields the API parses."""
    from inspector.ci.submit import _form
    from inspector.cli import build_parser
    from server.api.formfields import parse_options

    args = build_parser().parse_args(
        ["submit", "model.py:Net", "--server", "http://x", "--fit", "24GiB", "--batch", "64"]
    )
    form = _form(args)
    assert form["fit"] == "24GiB" and form["fit_batch"] == "64"
    options = parse_options(optimizer="adamw", dtype="float32", device=None, fake=True,
                            budget=None, default_device="cpu", fit=form["fit"],
                            fit_batch=form["fit_batch"])  # fmt: skip
    assert options["fit_bytes"] == 24 * GIB and options["fit_batch"] == 64
