"""The pages besides the report itself: upload, the list of reports, two reports compared."""

from __future__ import annotations

import math

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from inspector.report import Report
from inspector.schema.statuses import JOB_STATUSES
from server.api import queries
from server.db import SessionDep
from server.models import Job
from server.pages.access import may_list
from server.pages.compareview import compare_view
from server.pages.rendering import not_found, render
from server.pages.reportview import folds_of, parse_report
from server.pages.uploadview import option_selects, presets
from server.workers_seen import FRESH_S, libraries_on_offer

__all__ = ["router", "PER_PAGE", "search_filters"]

router = APIRouter(tags=["pages"])
PER_PAGE = 25
RECENT = 8  # reports listed under the upload form


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def upload_page(request: Request, session: SessionDep) -> HTMLResponse:
    """Upload a model; the latest reports below."""
    recent = queries.recent_jobs(session, limit=RECENT) if may_list(request, session) else []
    options = option_selects(request.app.state.settings.device)
    return render(
        request, "upload.html", recent=recent, presets=presets(), options=options,
        libraries=libraries_on_offer(session), fresh_minutes=FRESH_S // 60,
    )  # fmt: skip


def search_filters(q: str) -> tuple[str | None, dict[str, str]]:
    """The search box's words as the API's filters: `key=value` words are tags (all must
    match), the other words a substring of the name: `resnet branch=main` ->
    ('resnet', {'branch': 'main'})."""
    words, tags = [], {}
    for word in q.split():
        key, sep, value = word.partition("=")
        if sep and key:
            tags[key] = value
        else:
            words.append(word)
    return " ".join(words) or None, tags


@router.get("/reports", response_class=HTMLResponse, include_in_schema=False)
def reports_page(
    request: Request, session: SessionDep, q: str = "", status: str = "", page: int = 1
) -> HTMLResponse:
    """All reports, newest first, searchable by name, tag and status."""
    if not may_list(request, session):
        return render(request, "sign_in.html", status_code=401)
    q, page = q.strip()[:200], max(page, 1)
    status = status if status in JOB_STATUSES else ""
    name, tags = search_filters(q)
    jobs, total = queries.list_jobs(
        session, name=name, tags=tags, statuses=[status] if status else [],
        limit=PER_PAGE, offset=(page - 1) * PER_PAGE,
    )  # fmt: skip
    pages = max(1, math.ceil(total / PER_PAGE))
    return render(
        request, "reports.html", jobs=jobs, total=total, q=q, status=status, page=page,
        pages=pages,
    )  # fmt: skip


@router.get("/compare/{pair}", response_class=HTMLResponse, include_in_schema=False)
def compare_page(request: Request, pair: str, session: SessionDep) -> HTMLResponse:
    """Two reports side by side: `/compare/<a>..<b>`."""
    a_slug, sep, b_slug = pair.partition("..")
    found = [_done_report(session, s) for s in (a_slug, b_slug)] if sep else [(None, None, {})] * 2
    (a, report_a, raw_a), (b, report_b, raw_b) = found
    if report_a is None or report_b is None:
        return not_found(request, "pair of finished reports")
    view = compare_view(report_a, report_b)
    # Both graphs fold their runs of identical blocks as the report page does.
    folds = {"a": folds_of(raw_a), "b": folds_of(raw_b)}
    return render(request, "compare.html", a=a, b=b, view=view, folds=folds)


def _done_report(session: Session, slug: str) -> tuple[Job | None, Report | None, dict]:
    """The job, its whole report (modules included) when it is done, and the raw JSON."""
    job, text = queries.find_job_and_report_text(session, slug=slug)
    if job is None or job.status != "done":
        return job, None, {}
    report, raw = parse_report(text, modules=True)
    return job, report, raw
