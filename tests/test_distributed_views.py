"""The distributed section as people read it: the report page's tables, the terminal,
and `parallel` through the API."""

from __future__ import annotations

import io

from api_support import api_env, upload
from fastapi.testclient import TestClient
from pages_data import small_report
from pages_server import insert_job, make_settings
from rich.console import Console

from inspector.render.terminal import render_terminal
from inspector.report import Distributed, GpusNeeded, ParallelPlan, Report
from server.app import create_app
from server.db import make_engine, make_session_factory

GIB = 1024**3


def distributed_report() -> Report:
    report = small_report(name="mlp")
    fits = {str(16 * GIB): False, str(80 * GIB): True}
    report.distributed = Distributed(
        batch_per_rank=64,
        plans=[
            ParallelPlan(strategy="fsdp", spec="fsdp:8", world_size=8,
                         per_rank_peak_bytes=20 * GIB, param_bytes=GIB, grad_bytes=GIB,
                         optimizer_bytes=2 * GIB, saved_activation_bytes=15 * GIB,
                         comm_bytes=GIB // 2, peak_phase="backward", peak_where="layers.0",
                         fits=fits, notes=["scaled to 80 identical blocks"]),
            ParallelPlan(strategy="ddp", spec="ddp:8", world_size=8, error="no memory run"),
        ],
        gpus_needed=[GpusNeeded(strategy="fsdp", budget_bytes=16 * GIB),
                     GpusNeeded(strategy="fsdp", budget_bytes=80 * GIB, gpus=6,
                                per_rank_peak_bytes=70 * GIB)],
    )  # fmt: skip
    return report


def test_report_page_shows_the_plans_and_the_gpus_needed(tmp_path) -> None:
    settings = make_settings(tmp_path)
    factory = make_session_factory(make_engine(settings.database_url))
    with TestClient(create_app(settings)) as client:
        html = client.get(f"/r/{insert_job(factory, distributed_report(), name='d')}").text
        plain = client.get(f"/r/{insert_job(factory, small_report(), name='p')}").text
    section = html.split('id="distributed"', 1)[1].split("</section>", 1)[0]
    plans, gpus = section.split("<tbody>")[1:3]
    fsdp, ddp = plans.split("<tr")[1:3]
    assert "fsdp:8" in fsdp and "20.00 GiB" in fsdp and ">no<" in fsdp and ">fits<" in fsdp
    assert "no memory run" in ddp
    assert "no fit" in gpus and ">6 <" in gpus and "70.00 GiB" in gpus
    assert "<code>fsdp:8</code>: scaled to 80 identical blocks" in section  # the plan's note
    assert 'href="#distributed"' in html
    assert 'id="distributed"' not in plain


def test_terminal_distributed_section() -> None:
    out = io.StringIO()
    render_terminal(distributed_report(), console=Console(file=out, width=200))
    text = out.getvalue()
    assert "Distributed training (per rank, batch 64 per rank)" in text
    assert "20.00 GiB" in text and "backward (layers.0)" in text
    assert "fsdp:8: scaled to 80 identical blocks" in text
    line = next(row for row in text.splitlines() if row.strip().startswith("fsdp "))
    assert line.split()[1:] == ["no", "fit", "6"]


def test_parallel_through_the_api(tmp_path, monkeypatch) -> None:
    with api_env("sqlite", tmp_path, monkeypatch) as env:
        response = upload(
            env, data={"parallel": ["FSDP:8, reshard=false; ddp:2", "fsdp:2+TP:4, sp"]}
        )
        assert response.status_code == 201, response.text
        stored = env.job(response.json()["slug"]).options["parallel"]
        assert stored == ["fsdp:8,reshard=false", "ddp:2", "fsdp:2+tp:4,sp"]
        refused = upload(env, data={"parallel": "pp:2"})
        assert refused.status_code == 422
        assert "STRATEGY one of ddp, zero1, zero2, fsdp, tp, or fsdp:N+tp:M" in refused.text
