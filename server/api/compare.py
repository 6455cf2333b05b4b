"""Compare two reports: `/api/v1/compare/<a>..<b>` or `/api/v1/compare?a=&b=`."""

from __future__ import annotations

from fastapi import APIRouter, Request

from inspector.compare import compare_reports
from inspector.report import Report
from server.api import queries
from server.api.errors import ApiError
from server.api.reports import done_report
from server.api.schemas import Comparison, ErrorResponse
from server.api.views import side
from server.db import SessionDep

router = APIRouter(prefix="/api/v1", tags=["compare"])

_ERRORS = {
    404: {"model": ErrorResponse, "description": "no such report"},
    409: {"model": ErrorResponse, "description": "a report is not done"},
}


def compare_slugs(request: Request, session: SessionDep, a: str, b: str) -> Comparison:
    jobs = [queries.get_job(session, slug=s) for s in (a, b)]
    reports = [Report.model_validate(done_report(j)) for j in jobs]
    diff = compare_reports(*reports)
    return Comparison(a=side(request, jobs[0]), b=side(request, jobs[1]), **diff)


@router.get("/compare", response_model=Comparison, responses=_ERRORS)
def compare_query(a: str, b: str, request: Request, session: SessionDep) -> Comparison:
    """What changed from report `a` (the baseline) to report `b`."""
    return compare_slugs(request, session, a, b)


@router.get("/compare/{pair}", response_model=Comparison, responses=_ERRORS)
def compare_pair(pair: str, request: Request, session: SessionDep) -> Comparison:
    """Same as `/compare?a=&b=`, written `<a>..<b>` (slugs never contain '.')."""
    a, sep, b = pair.partition("..")
    if not sep or not a or not b:
        raise ApiError(422, "invalid", f"compare {pair!r}: write /api/v1/compare/<a>..<b>")
    return compare_slugs(request, session, a, b)
