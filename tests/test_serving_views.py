"""The serving section as people read it: the report page's card and table, the PR
Markdown, the terminal, and the option through the API."""

from __future__ import annotations

import io

import pytest
from api_support import api_env, upload
from fastapi.testclient import TestClient
from pages_data import small_report
from pages_server import insert_job, make_settings
from rich.console import Console

from inspector.render.markdown import render_markdown
from inspector.render.terminal import render_terminal
from inspector.report import Report, Serving, ServingLayer, ServingRow
from server.app import create_app
from server.db import make_engine, make_session_factory

GIB = 1024**3


def serving_report() -> Report:
    """Llama-3-8B's figures: 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 a token."""
    report = small_report(name="llama-3-8b")
    layers = [ServingLayer(index=i, kind="DynamicLayer", bytes_per_token=4096) for i in range(32)]
    fits = {str(24 * GIB): 3, str(80 * GIB): 121}
    report.serving = Serving(
        computed=True, batch=1, context=4096, weights_bytes=16 * GIB,
        weights_int8_bytes=9 * GIB, weights_int4_bytes=5 * GIB,
        kv_bytes_per_token=131_072, cache_fixed_bytes=0,
        cache_bytes_per_sequence=131_072 * 4096, layers=layers,
        prefill_peak_bytes=17 * GIB, decode_peak_bytes=int(16.6 * GIB),
        max_concurrent_sequences=fits,
        table=[ServingRow(context=4096, cache_bytes_per_sequence=512 * 1024**2,
                          prefill_peak_bytes=17 * GIB, max_concurrent_sequences=fits),
               ServingRow(context=32768, cache_bytes_per_sequence=4 * GIB,
                          prefill_peak_bytes=30 * GIB,
                          max_concurrent_sequences={str(24 * GIB): 0, str(80 * GIB): 12})],
        notes=["measured with the model's own cache on fake tensors (nothing allocated)"],
    )  # fmt: skip
    return report


def test_report_page_shows_the_serving_card_and_table(tmp_path) -> None:
    settings = make_settings(tmp_path)
    factory = make_session_factory(make_engine(settings.database_url))
    with TestClient(create_app(settings)) as client:
        slug = insert_job(factory, serving_report(), name="llama")
        html = client.get(f"/r/{slug}").text
        plain_slug = insert_job(factory, small_report(), name="mlp")
        plain = client.get(f"/r/{plain_slug}").text
    section = html.split('id="serving"', 1)[1].split("</section>", 1)[0]
    assert "KV cache per token" in section and "128.00 KiB" in section  # 131,072 bytes
    assert "512.00 MiB" in section and "at 4,096 tokens" in section
    rows = section.split("<tbody>", 1)[1].split("<tr")[1:]
    assert "4,096" in rows[0] and ">3<" in rows[0] and ">121<" in rows[0]
    assert "32,768" in rows[1] and ">0<" in rows[1] and ">12<" in rows[1]
    assert 'href="#serving"' in html
    assert 'id="serving"' not in plain  # no section when it was not asked for


def test_markdown_quotes_kv_bytes_per_token_when_present() -> None:
    assert "| KV cache per token | 128.00 KiB |" in render_markdown(serving_report())
    assert "KV cache per token" not in render_markdown(small_report())


def test_terminal_serving_section() -> None:
    out = io.StringIO()
    render_terminal(serving_report(), console=Console(file=out, width=160))
    text = out.getvalue()
    assert "KV cache per token  128.00 KiB (32 layers: DynamicLayer)" in text
    assert "Cache per sequence  512.00 MiB at 4,096 tokens" in text
    assert "32,768" in text and "Sequences that fit" in text


@pytest.mark.parametrize(("given", "stored"), [("on", True), ("off", False), ("auto", None)])
def test_the_serving_option_through_the_api(tmp_path, monkeypatch, given, stored) -> None:
    with api_env("sqlite", tmp_path, monkeypatch) as env:
        response = upload(env, data={"serving": given})
        assert response.status_code == 201, response.text
        assert env.job(response.json()["slug"]).options["serving"] is stored
        refused = upload(env, data={"serving": "maybe"})
        assert refused.status_code == 422
        assert "serving 'maybe': use one of auto, on, off" in refused.text
