"""The OpenAPI schema: served, valid, and a bounded schemathesis run against the ASGI app
in-process finds no server errors (the queue is faked: no real jobs start)."""

from __future__ import annotations

import pytest
import schemathesis
from api_support import api_env, finish, mlp_report, upload
from hypothesis import HealthCheck, given, settings
from openapi_spec_validator import validate
from schemathesis.checks import not_a_server_error

GUARDED = {  # route -> the statuses access control adds to its documentation
    ("/api/v1/reports", "post"): {"401", "429"},
    ("/api/v1/reports", "get"): {"401"},
    ("/api/v1/reports/{slug}/rerun", "post"): {"401", "429"},
    ("/api/v1/reports/{slug}", "delete"): {"401", "403"},
}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openapi")
    with pytest.MonkeyPatch.context() as monkeypatch, api_env("sqlite", tmp, monkeypatch) as env:
        slug = upload(env).json()["slug"]
        finish(env, slug, mlp_report())  # one done report, so lists and Markdown have content
        env.client.app.state.done_slug = slug
        yield env.client.app


def test_schema_is_served_and_valid(app):
    from fastapi.testclient import TestClient

    spec = TestClient(app).get("/openapi.json").json()
    validate(spec)  # raises on an invalid OpenAPI document
    for (path, method), statuses in GUARDED.items():
        assert statuses <= set(spec["paths"][path][method]["responses"]), (path, method)
    error = spec["components"]["schemas"]["ErrorBody"]["properties"]
    assert set(error) == {"code", "message", "detail"}


def operations(app) -> list:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    return [result.ok() for result in schema.get_all_operations()]


FUZZ = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,  # the same cases every run: a failure here is reproducible
    database=None,
)


def _fuzz(strategy, seen: list, path: dict[str, str] | None = None) -> None:
    @FUZZ
    @given(case=strategy)
    def run(case) -> None:
        for name, value in (path or {}).items():  # aim at a real report: past the 404s
            if name in (case.path_parameters or {}):
                case.path_parameters[name] = value
        response = case.call()
        seen.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error])

    run()


def test_no_server_errors(app):
    """Each operation with schemathesis-generated requests (valid and not): never a 500.
    (schemathesis' pytest plugin does not run on pytest 9, so its strategies are driven here.)"""
    statuses: dict[str, list[int]] = {}
    slug = app.state.done_slug
    for operation in operations(app):
        seen = statuses.setdefault(operation.label, [])
        _fuzz(operation.as_strategy(), seen)
        if operation.method.upper() != "DELETE":
            _fuzz(operation.as_strategy(), seen, {"slug": slug, "pair": f"{slug}..{slug}"})
    assert "POST /api/v1/reports" in statuses and len(statuses) >= 8
    assert all(seen for seen in statuses.values())  # every operation was exercised
    assert not [s for seen in statuses.values() for s in seen if s >= 500]
