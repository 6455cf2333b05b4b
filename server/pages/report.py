"""The report page, `/r/<slug>`: live progress, the failure, or the whole analysis, and
the kept copies of done reports' pages (see server/readcache.py).

A done report never changes, so its page is rendered once per process and kept (gzipped
once). Readers without listing rights all get the same page; listers also get the "compare
with" choices, spliced into the kept page instead of rendering the report again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import partial

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from inspector.schema.statuses import RUNNING_STATUSES
from server.api import queries
from server.api.errors import ApiError
from server.api.queries import JobLink
from server.auth import known_identity
from server.db import SessionDep, release
from server.pages.access import may_list
from server.pages.failureview import error_of, unreadable
from server.pages.rendering import not_found, render, script_json, templates
from server.pages.reportview import parse_report, report_context
from server.readcache import Cached, ReadCache, cached_response

__all__ = ["router", "PICKER_TTL_S"]

router = APIRouter(tags=["pages"])

PICKER_TTL_S = 5.0  # a newly done report shows up in other pages' "compare with" by then
CHOICES_AT = b'<datalist id="compare-options">'  # report.html: where the choices go
PICKER_SIZE = 30


@router.get("/r/{slug}", response_class=HTMLResponse, include_in_schema=False)
async def report_page(request: Request, slug: str, session: SessionDep) -> Response:
    """One report: live progress, the failure, or the whole analysis."""
    # A kept page is sent from the event loop when choosing it needs no database read;
    # anything else is read in a worker thread, as in a sync endpoint.
    found = _kept_page_now(request, slug)
    if found is None:
        found = await run_in_threadpool(_report_page, request, session, slug)
    return cached_response(request, found) if isinstance(found, Cached) else found


def _kept_page_now(request: Request, slug: str) -> Cached | None:
    """The kept page for this caller if neither its listing rights (a token to look up)
    nor the "compare with" choices (read every PICKER_TTL_S) need the database."""
    cache: ReadCache = request.app.state.read_cache
    try:
        known = known_identity(request, request.app.state.settings)
    except ApiError:  # no identity: not a lister
        return cache.peek(("page", slug, "reader"))
    recent = cache.peek_memo("recent_done", PICKER_TTL_S)
    if known is None or recent is None:
        return None
    others = [other for other in recent if other.slug != slug]
    return cache.peek(("page", slug, "lister"), tag=_choices_tag(others))


def _report_page(request: Request, session: Session, slug: str) -> Cached | Response:
    others = _compare_choices(request, session, slug)
    found = _kept_page(
        request, session, slug, "reader", lambda: _build_report_page(request, session, slug)
    )
    if others is not None and isinstance(found, Cached):  # the same page, with choices
        page, tag = found, _choices_tag(others)
        found = _kept_page(
            request, session, slug, "lister", lambda: _with_choices(request, page, others, tag),
            tag=tag,
        )  # fmt: skip
    release(session)
    return found


def _choices_tag(others: list[JobLink]) -> str:
    return hashlib.sha256(repr(others).encode()).hexdigest()


def _kept_page(
    request: Request,
    session: Session,
    slug: str,
    variant: str,
    build: Callable[[], Cached | Response],
    tag: str = "",
) -> Cached | Response:
    """The kept page `variant` of report `slug`, else what `build()` returns."""
    cache: ReadCache = request.app.state.read_cache
    still_done = partial(queries.is_done, session, slug=slug)
    return cache.fetch(("page", slug, variant), build, still_done=still_done, tag=tag)


def _build_report_page(request: Request, session: Session, slug: str) -> Cached | HTMLResponse:
    """The page as a reader without listing rights sees it: no "compare with" choices."""
    job, text = queries.find_job_and_report_text(session, slug=slug)
    if job is None:
        return not_found(request, "report")
    if job.status in RUNNING_STATUSES:
        return render(request, "progress.html", job=job)
    report, raw = parse_report(text)
    if job.status != "done":
        return render(request, "failed.html", job=job, error=error_of(job, report))
    if report is None:
        return render(request, "failed.html", job=job, error=unreadable(job))
    release(session)  # rendering a big report needs no connection
    context = report_context(report, raw)
    data = script_json(text or "{}")
    page = render(request, "report.html", job=job, others=[], report_json=data, **context)
    return request.app.state.read_cache.entry(bytes(page.body), "text/html")


def _with_choices(request: Request, page: Cached, others: list[JobLink], tag: str) -> Cached:
    """`page` with the "compare with" choices where `report.html` includes them: the same
    bytes as rendering it all with `others`, without parsing and rendering the report again
    each time a new report shows up."""
    choices = templates.get_template("_compare_options.html").render(others=others)
    at = page.body.index(CHOICES_AT) + len(CHOICES_AT)
    body = page.body[:at] + choices.encode() + page.body[at:]
    return request.app.state.read_cache.entry(body, "text/html", tag=tag)


def _compare_choices(request: Request, session: Session, slug: str) -> list[JobLink] | None:
    """The "compare with" picker's reports (recent done ones), for listers only (None for
    others). Read at most every PICKER_TTL_S per process, not on every page view."""
    if not may_list(request, session):
        return None
    recent = request.app.state.read_cache.memo(
        "recent_done", PICKER_TTL_S, lambda: queries.recent_done(session, limit=PICKER_SIZE)
    )
    return [other for other in recent if other.slug != slug]
