"""Data access for the API, the pages and the metrics: keyword-only functions over a
Session. Every SQL statement of the web layer is here, so a list means the same thing in
the HTML page and in the API."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Select, Text, case, cast, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, aliased, defer, selectinload

from server.api.errors import ApiError
from server.models import Job, Tag, Upload, utcnow

__all__ = [
    "JobLink",
    "get_job",
    "find_job_and_report_text",
    "get_job_and_report_text",
    "is_done",
    "list_jobs",
    "recent_jobs",
    "recent_done",
    "queue_position",
    "ensure_upload",
    "add_job",
    "count_by_status",
    "run_time_histogram",
]


class JobLink(NamedTuple):
    """Enough of a job to link to it (the report page's "compare with" choices)."""

    slug: str
    name: str
    created_at: dt.datetime | None


def get_job(session: Session, *, slug: str) -> Job:
    job = session.scalar(select(Job).where(Job.slug == slug).options(selectinload(Job.tags)))
    if job is None:
        raise ApiError(404, "not_found", f"no report {slug!r}: check the link")
    return job


def find_job_and_report_text(session: Session, *, slug: str) -> tuple[Job | None, str | None]:
    """The job and its report as the stored JSON text, (None, None) when there is no such
    job: served (or handed to the page's scripts) as is, no parse and re-serialize of
    megabytes per request."""
    query = (
        select(Job, cast(Job.report_json, Text))
        .options(defer(Job.report_json), selectinload(Job.tags))
        .where(Job.slug == slug)
    )
    row = session.execute(query).first()
    return (row[0], row[1]) if row else (None, None)


def get_job_and_report_text(session: Session, *, slug: str) -> tuple[Job, str | None]:
    """As `find_job_and_report_text`, a 404 when there is no such job."""
    job, text = find_job_and_report_text(session, slug=slug)
    if job is None:
        raise ApiError(404, "not_found", f"no report {slug!r}: check the link")
    return job, text


def is_done(session: Session, *, slug: str) -> bool:
    """Whether report `slug` still exists and is done (one indexed row, no report JSON)."""
    query = select(Job.id).where(Job.slug == slug, Job.status == "done")
    return session.scalar(query) is not None


def _filtered(
    query: Select[Any], *, name: str | None, tags: dict[str, str], statuses: Sequence[str]
) -> Select[Any]:
    if name:
        escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = query.where(Job.name.ilike(f"%{escaped}%", escape="\\"))
    for key, value in tags.items():  # every tag must match: one join per tag
        tag = aliased(Tag)
        query = query.join(tag, tag.job_id == Job.id).where(tag.key == key, tag.value == value)
    if statuses:
        query = query.where(Job.status.in_(list(statuses)))
    return query


def list_jobs(
    session: Session,
    *,
    name: str | None = None,
    tags: dict[str, str] | None = None,
    statuses: Sequence[str] = (),
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[Job], int]:
    """Newest first; returns (page, total matching). The one query behind both lists of
    reports: `GET /api/v1/reports` and the `/reports` page."""
    filters = {"name": name, "tags": tags or {}, "statuses": statuses}
    total = session.scalar(_filtered(select(func.count(Job.id)), **filters)) or 0
    page = _newest_first(_filtered(_listing(), **filters)).limit(limit).offset(offset)
    return list(session.scalars(page)), total


def recent_jobs(session: Session, *, limit: int) -> list[Job]:
    """The newest jobs, as `list_jobs` orders them, without counting them all."""
    return list(session.scalars(_newest_first(_listing()).limit(limit)))


def recent_done(session: Session, *, limit: int) -> list[JobLink]:
    """The newest done jobs, as links."""
    query = select(Job.slug, Job.name, Job.created_at).where(Job.status == "done")
    return [JobLink(*r) for r in session.execute(_newest_first(query).limit(limit))]


def _listing() -> Select[Any]:
    # Lists show the summary columns: never the (large) report or error JSON.
    return select(Job).options(
        defer(Job.report_json), defer(Job.error_json), selectinload(Job.tags)
    )


def _newest_first(query: Select[Any]) -> Select[Any]:
    return query.order_by(Job.created_at.desc(), Job.id.desc())


def queue_position(session: Session, *, job: Job) -> int | None:
    """1 for the next job to run; None when the job is not waiting."""
    if job.status != "queued":
        return None
    ahead = select(func.count(Job.id)).where(Job.status == "queued", Job.id < job.id)
    return (session.scalar(ahead) or 0) + 1


def ensure_upload(
    session: Session, *, sha256: str, size_bytes: int, filename: str, kind: str
) -> None:
    """Record a stored file once (the same content uploaded twice is one row). An upsert:
    two concurrent uploads of the same file must not collide on the primary key."""
    if session.get(Upload, sha256) is not None:
        return
    values = {"sha256": sha256, "size_bytes": size_bytes, "filename": filename, "kind": kind}
    dialect = session.get_bind().dialect.name
    if dialect in ("postgresql", "sqlite"):
        insert = pg_insert if dialect == "postgresql" else sqlite_insert
        statement = insert(Upload).values(created_at=utcnow(), **values)
        session.execute(statement.on_conflict_do_nothing(index_elements=["sha256"]))
    else:
        session.add(Upload(**values))
    session.flush()


def add_job(session: Session, *, tags: dict[str, str], **columns: Any) -> Job:
    job = Job(**{"status": "queued", "progress": 0, "attempts": 0, **columns})
    job.tags = [Tag(key=k, value=v) for k, v in tags.items()]
    session.add(job)
    session.flush()
    return job


def reusable_job(session: Session, key: str) -> Job | None:
    """The newest done report with this result key (server/resultkey.py), if any."""
    query = select(Job).where(Job.result_key == key, Job.status == "done")
    query = query.where(Job.report_json.is_not(None)).order_by(Job.id.desc()).limit(1)
    return session.scalar(query)


def count_by_status(session: Session) -> dict[str, int]:
    """How many jobs there are of each status present."""
    query = select(Job.status, func.count()).group_by(Job.status)
    return {status: int(n) for status, n in session.execute(query).all()}


def run_time_histogram(
    session: Session, *, bounds: Sequence[float]
) -> tuple[list[int], float, int]:
    """Jobs that ran (claim to end): how many took at most each bound (cumulative), the
    seconds they took in all, and how many they are."""
    seconds = _run_seconds(session.get_bind().dialect.name)
    columns = [func.sum(case((seconds <= b, 1), else_=0)) for b in bounds]
    columns += [func.sum(seconds), func.count()]
    ran = (Job.finished_at.is_not(None), Job.started_at.is_not(None))
    row = session.execute(select(*columns).where(*ran)).one()
    return [int(v or 0) for v in row[:-2]], float(row[-2] or 0.0), int(row[-1] or 0)


def _run_seconds(dialect: str) -> ColumnElement[Any]:
    if dialect == "postgresql":
        return func.extract("epoch", Job.finished_at - Job.started_at)
    return (func.julianday(Job.finished_at) - func.julianday(Job.started_at)) * 86400.0
