"""Reports: status and report, list, Markdown summary, re-run, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse
from sqlalchemy.orm import Session

from inspector.schema.statuses import FINAL_STATUSES, JOB_STATUSES
from server.api import queries
from server.api.dispatch import enqueue, require_sandbox
from server.api.errors import ApiError
from server.api.formfields import parse_tags
from server.api.schemas import CreatedReport, ErrorResponse, ReportDetail, ReportList
from server.api.views import base_url, detail, job_urls, row
from server.auth import (
    ADMIN_RESPONSES,
    AUTH_RESPONSES,
    UPLOAD_AUTH_RESPONSES,
    AdminDep,
    IdentityDep,
    UploaderDep,
)
from server.blobs.refs import delete_blobs, forget_uploads, unused_uploads
from server.db import SessionDep, release
from server.models import Job, utcnow
from server.readcache import Cached, CacheKey, ReadCache, cached_response
from server.storage import UploadStore

router = APIRouter(prefix="/api/v1", tags=["reports"])

_404 = {404: {"model": ErrorResponse, "description": "no such report"}}
_409 = {409: {"model": ErrorResponse, "description": "the report is not done yet"}}


@router.get("/reports/{slug}", response_model=ReportDetail, responses=_404)
async def get_report(slug: str, request: Request, session: SessionDep) -> Response:
    """A job's status, progress and error; the whole report once done."""
    key = ("json", slug, base_url(request))  # the envelope's links start with the base URL
    # A kept body is sent from the event loop: it never queues for a worker thread behind
    # uploads and database reads. Anything else is read in a thread, as in a sync endpoint.
    found = request.app.state.read_cache.peek(key)
    if found is None:
        found = await run_in_threadpool(_fetch_report, request, session, key)
    return cached_response(request, found) if isinstance(found, Cached) else found


def _fetch_report(request: Request, session: Session, key: CacheKey) -> Cached | Response:
    cache: ReadCache = request.app.state.read_cache
    slug = key[1]
    found = cache.fetch(
        key, lambda: _report_body(request, session, slug),
        still_done=lambda: queries.is_done(session, slug=slug),
    )  # fmt: skip
    release(session)
    return found


def _report_body(request: Request, session: Session, slug: str) -> Cached | Response:
    job, text = queries.get_job_and_report_text(session, slug=slug)
    position = queries.queue_position(session, job=job)
    release(session)  # the report may be megabytes: no connection held while it is sent
    body = detail(request, job, position, with_report=False).model_dump_json()
    if text is not None:  # the stored JSON spliced in: key names are never escaped text
        body = body.replace('"report":null', f'"report":{text}', 1)
    if job.status == "done" and text is not None:  # it never changes again: kept
        return request.app.state.read_cache.entry(body.encode(), "application/json")
    return Response(body, media_type="application/json")


def _statuses(values: list[str]) -> list[str]:
    statuses = [s.strip() for v in values for s in v.split(",") if s.strip()]
    unknown = [s for s in statuses if s not in JOB_STATUSES]
    if unknown:
        allowed = ", ".join(JOB_STATUSES)
        raise ApiError(422, "invalid", f"status {unknown[0]!r}: use one of {allowed}")
    return statuses


@router.get("/reports", response_model=ReportList, responses=AUTH_RESPONSES)
def list_reports(
    request: Request,
    session: SessionDep,
    _identity: IdentityDep,  # the list would reveal every unguessable link
    name: Annotated[str | None, Query(description="substring of the name, any case")] = None,
    tag: Annotated[list[str] | None, Query(description="key=value; repeat for several")] = None,
    status: Annotated[list[str] | None, Query(description="e.g. done or failed,timed_out")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> ReportList:
    """Reports, newest first, with their summary figures."""
    jobs, total = queries.list_jobs(
        session, name=name, tags=parse_tags(tag or []), statuses=_statuses(status or []),
        limit=limit, offset=offset,
    )  # fmt: skip
    next_offset = offset + len(jobs) if offset + len(jobs) < total else None
    items = [row(request, j) for j in jobs]
    return ReportList(items=items, total=total, limit=limit, offset=offset, next_offset=next_offset)


def done_report(job: Job) -> dict:
    if job.status != "done" or job.report_json is None:
        raise ApiError(
            409, "not_done", f"report {job.slug!r} is not done (status: {job.status})",
            {"status": job.status},
        )  # fmt: skip
    return job.report_json


@router.get(
    "/reports/{slug}/markdown",
    response_class=PlainTextResponse,
    responses={**_404, **_409, 200: {"content": {"text/markdown": {}}}},
)
def get_markdown(
    slug: str,
    request: Request,
    session: SessionDep,
    baseline: Annotated[str | None, Query(description="slug of a report to show deltas to")] = None,
) -> Response:
    """A compact Markdown summary, fit for a pull-request comment."""
    from inspector.render.markdown import render_markdown
    from inspector.report import Report

    job = queries.get_job(session, slug=slug)
    report = Report.model_validate(done_report(job))
    base = None
    if baseline:
        base = Report.model_validate(done_report(queries.get_job(session, slug=baseline)))
    text = render_markdown(report, link=job_urls(request, slug)["url"], baseline=base)
    return Response(text, media_type="text/markdown; charset=utf-8")


@router.post(
    "/reports/{slug}/rerun",
    status_code=201,
    response_model=CreatedReport,
    responses=_404 | UPLOAD_AUTH_RESPONSES,
)
def rerun_report(
    slug: str, request: Request, session: SessionDep, _identity: UploaderDep
) -> CreatedReport:
    """Run a finished job again from its kept upload: a new job with a new slug."""
    settings = request.app.state.settings
    store: UploadStore = request.app.state.store
    old = queries.get_job(session, slug=slug)
    if old.status not in FINAL_STATUSES:
        raise ApiError(409, "not_finished", f"report {slug!r} is still {old.status}")
    for sha in filter(None, (old.upload_sha256, old.input_sha256)):
        if not store.exists(sha):
            raise ApiError(410, "gone", f"the upload of {slug!r} is no longer stored; upload again")
    require_sandbox(settings)
    job = queries.add_job(session, tags=old.tag_dict, **_copied_columns(old))
    session.commit()
    enqueue(job.id, settings)
    return CreatedReport(slug=job.slug, status=job.status, **job_urls(request, job.slug))


def _copied_columns(job: Job) -> dict:
    names = ("name", "upload_sha256", "upload_filename", "upload_kind", "entrypoint")
    names += ("input_spec", "input_sha256", "input_filename", "options")
    return {n: getattr(job, n) for n in names}


@router.delete("/reports/{slug}", status_code=204, responses=_404 | ADMIN_RESPONSES)
def delete_report(
    slug: str, request: Request, session: SessionDep, _identity: AdminDep
) -> Response:
    """Delete a report, its tags, and its stored files unless another report uses them."""
    started = utcnow()
    job = queries.get_job(session, slug=slug)
    session.delete(job)
    unused = unused_uploads(session, sha256s=[job.upload_sha256, job.input_sha256 or ""])
    forget_uploads(session, sha256s=[u.sha256 for u in unused])
    session.commit()
    request.app.state.read_cache.drop(slug)  # other processes: within the cache's TTL
    # Rows first, then blobs; the same file uploaded again meanwhile keeps its blob.
    delete_blobs(request.app.state.store, sha256s=[u.sha256 for u in unused], since=started)
    return Response(status_code=204)
