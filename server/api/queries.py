"""Data access for the API: keyword-only functions over a Session."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, Text, cast, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, aliased, defer, selectinload

from server.api.errors import ApiError
from server.models import Job, Tag, Upload, utcnow

__all__ = ["get_job", "is_done", "list_jobs", "queue_position", "ensure_upload", "add_job"]


def get_job(session: Session, *, slug: str) -> Job:
    job = session.scalar(select(Job).where(Job.slug == slug).options(selectinload(Job.tags)))
    if job is None:
        raise ApiError(404, "not_found", f"no report {slug!r}: check the link")
    return job


def get_job_and_report_text(session: Session, *, slug: str) -> tuple[Job, str | None]:
    """The job and its report as the stored JSON text: served as is, no parse and
    re-serialize of megabytes per request."""
    query = (
        select(Job, cast(Job.report_json, Text))
        .options(defer(Job.report_json), selectinload(Job.tags))
        .where(Job.slug == slug)
    )
    row = session.execute(query).first()
    if row is None:
        raise ApiError(404, "not_found", f"no report {slug!r}: check the link")
    return row[0], row[1]


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
    """Newest first; returns (page, total matching)."""
    filters = {"name": name, "tags": tags or {}, "statuses": statuses}
    total = session.scalar(_filtered(select(func.count(Job.id)), **filters)) or 0
    page = _filtered(select(Job), **filters).options(selectinload(Job.tags))
    page = page.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit).offset(offset)
    return list(session.scalars(page)), total


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
    job = Job(status="queued", progress=0, attempts=0, **columns)
    job.tags = [Tag(key=k, value=v) for k, v in tags.items()]
    session.add(job)
    session.flush()
    return job
