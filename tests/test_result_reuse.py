"""A repeated upload (same model bytes, entrypoint, input and options, same code) is
answered at once from the done report, as a new report of its own; anything that changes
the result runs again. Both databases."""

from __future__ import annotations

import pytest
from api_support import BACKENDS, MLP_SOURCE, api_env, finish, mlp_report, upload

from server.resultkey import result_key
from server.stagetimes import recent_stage_seconds


@pytest.fixture(params=BACKENDS)
def env(request, tmp_path, monkeypatch):
    with api_env(request.param, tmp_path, monkeypatch) as env:
        yield env


def _done_first(env) -> str:
    first = upload(env, data={"tags": "commit=a1"})
    assert first.status_code == 201 and first.json()["reused_from"] is None
    report = mlp_report(hidden=16, warnings=1)
    report.meta.timings_s = {"memory": 2.5}
    finish(env, first.json()["slug"], report)
    return first.json()["slug"]


def test_a_repeat_is_done_at_once_with_the_same_report(env) -> None:
    slug = _done_first(env)
    again = upload(env, data={"tags": "commit=b2", "name": "second push"})
    assert again.status_code == 201
    body = again.json()
    assert (body["status"], body["reused_from"]) == ("done", slug)
    assert env.enqueued == [env.job(slug).id]  # the repeat was never queued
    copy, source = env.job(body["slug"]), env.job(slug)
    assert copy.report_json == source.report_json and copy.slug != slug
    assert (copy.name, copy.tag_dict) == ("second push", {"commit": "b2"})  # its own
    assert (copy.params, copy.findings_warnings) == (source.params, 1)  # summary columns
    assert copy.started_at is None and copy.finished_at is not None
    detail = env.client.get(f"/api/v1/reports/{body['slug']}").json()
    assert detail["reused_from"] == slug and detail["report"]["totals"]["params"] == 212
    # the copy of a copy names the report that ran
    assert upload(env).json()["reused_from"] == slug
    page = env.client.get(f"/r/{body['slug']}").text
    assert f'href="/r/{slug}"' in page and "Reused the result of" in page
    # a reused report never ran: learned stage times count the run once
    with env.factory() as session:
        assert recent_stage_seconds(session) == {"memory": 2.5}


def test_what_changes_the_result_runs_again(env) -> None:
    _done_first(env)
    changed = [
        {"data": {"optimizer": "sgd"}},
        {"data": {"input": '{"x": {"shape": [3, 8]}}'}},
        {"data": {"entrypoint": "model.py:build"}},
        {"source": MLP_SOURCE + b"\n# a comment changes the bytes\n"},
        {"data": {"rerun": "true"}},
    ]
    for case in changed:
        response = upload(env, **case)
        assert response.status_code == 201, response.text
        assert (response.json()["status"], response.json()["reused_from"]) == ("queued", None)
    assert len(env.enqueued) == 1 + len(changed)


def test_only_done_reports_are_reused(env) -> None:
    first = upload(env)
    finish(env, first.json()["slug"], status="failed")
    assert upload(env).json()["reused_from"] is None  # a failure is tried again
    queued = upload(env)  # and one still queued is no result yet
    assert upload(env).json()["reused_from"] is None and queued.json()["status"] == "queued"


def test_the_key_ignores_spec_layout_and_follows_options() -> None:
    base = {"upload_sha256": "0" * 64, "upload_kind": "py", "entrypoint": "m.py:Net",
            "input_sha256": None, "options": {"fake": True, "optimizer": "adamw"}}  # fmt: skip
    a = result_key(input_spec='{"x": {"shape": [2, 8]}}', **base)
    b = result_key(input_spec='{ "x" : {"shape":[2,8]} }', **base)
    assert a == b and len(a) == 64
    other = {**base, "options": {"fake": False, "optimizer": "adamw"}}
    assert result_key(input_spec='{"x": {"shape": [2, 8]}}', **other) != a


def test_submit_asks_for_a_rerun() -> None:
    from inspector.ci.submit import _form
    from inspector.cli import build_parser

    parse = build_parser().parse_args
    assert _form(parse(["submit", "m.py:Net", "--server", "http://x"]))["rerun"] is None
    args = parse(["submit", "m.py:Net", "--server", "http://x", "--rerun"])
    assert _form(args)["rerun"] == "true"
