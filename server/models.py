"""Database tables: jobs (one per upload run, with the report), their tags, uploads, and the
blob store's chunks (`INSPECTOR_BLOB_STORE=database`)."""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = [
    "Base", "Job", "Tag", "Upload", "ApiToken", "UploadEvent", "Blob", "BlobChunk",
    "new_slug", "utcnow",
]  # fmt: skip


# The whole report: JSONB on Postgres (indexable, compact), JSON text elsewhere.
JSONType = JSON().with_variant(JSONB(), "postgresql")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_slug() -> str:
    """22 URL-safe characters, 128 random bits: reports are reached by unguessable links."""
    return secrets.token_urlsafe(16)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC in and out, also on SQLite (which stores naive datetimes)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: use server.models.utcnow()")
        return value.astimezone(dt.timezone.utc)

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)


class Base(DeclarativeBase):
    pass


class Upload(Base):
    """A stored file (model or input tensor file), content-addressed by sha256."""

    __tablename__ = "uploads"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    filename: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16))  # py, zip, pt2, pt, safetensors
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Job(Base):
    """One analysis run of an upload; `report_json` holds the whole report once done."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_status_id", "status", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slug: Mapped[str] = mapped_column(String(32), unique=True, default=new_slug)
    name: Mapped[str] = mapped_column(String(200), index=True)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    stage: Mapped[str | None] = mapped_column(String(64))
    progress: Mapped[int] = mapped_column(Integer, default=0)
    error_kind: Mapped[str | None] = mapped_column(String(32))
    error_message: Mapped[str | None] = mapped_column(Text)
    error_json: Mapped[dict | None] = mapped_column(JSONType)
    upload_sha256: Mapped[str] = mapped_column(String(64), index=True)  # what uses a blob
    upload_filename: Mapped[str] = mapped_column(String(255))
    upload_kind: Mapped[str] = mapped_column(String(8))  # py, zip, pt2, config, preset
    entrypoint: Mapped[str] = mapped_column(String(512))
    input_spec: Mapped[str | None] = mapped_column(Text)
    input_sha256: Mapped[str | None] = mapped_column(String(64), index=True)
    input_filename: Mapped[str | None] = mapped_column(String(255))
    options: Mapped[dict] = mapped_column(JSONType, default=dict)
    # what decides the report (server/resultkey.py); a done job's is reused by a repeat
    result_key: Mapped[str | None] = mapped_column(String(64), index=True)
    reused_from: Mapped[str | None] = mapped_column(String(32))  # the slug it was copied from
    report_json: Mapped[dict | None] = mapped_column(JSONType)
    # Summary columns, copied out of the report for listing, filtering and comparing.
    params: Mapped[int | None] = mapped_column(BigInteger)
    flops_forward: Mapped[int | None] = mapped_column(BigInteger)
    train_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    forward_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    findings_errors: Mapped[int] = mapped_column(Integer, default=0)
    findings_warnings: Mapped[int] = mapped_column(Integer, default=0)
    capture_method: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(128))
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())

    tags: Mapped[list[Tag]] = relationship(
        back_populates="job", cascade="all, delete-orphan", passive_deletes=True, order_by="Tag.id"
    )

    @property
    def tag_dict(self) -> dict[str, str]:
        return {t.key: t.value for t in self.tags}


class Tag(Base):
    """A `key=value` label on a job (git commit, branch, ...), for filtering."""

    __tablename__ = "tags"
    __table_args__ = (Index("ix_tags_key_value", "key", "value"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(String(64))
    value: Mapped[str] = mapped_column(String(256))

    job: Mapped[Job] = relationship(back_populates="tags")


class ApiToken(Base):
    """An API token for CI: only its sha256 is stored; the token itself is shown once."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))  # the first characters, to recognise it
    scope: Mapped[str] = mapped_column(String(16), default="upload")  # upload or admin
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())


class UploadEvent(Base):
    """One accepted upload by an identity (`token:<id>`, `user:<name>`): the rate window."""

    __tablename__ = "upload_events"
    __table_args__ = (Index("ix_upload_events_key_at", "key", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(300))
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Blob(Base):
    """A file in the database's blob store, content-addressed; its bytes are in `blob_chunks`.

    Inserted in the same transaction as all its chunks: a row means a complete blob."""

    __tablename__ = "blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    chunk_count: Mapped[int] = mapped_column(Integer)
    # Set when stored and again whenever the same content is stored again: deletions spare
    # a blob put since they started (an upload racing with a delete of the same file).
    touched_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class BlobChunk(Base):
    """Bytes `seq * chunk size` onwards of a blob (1 MiB each; the last one shorter)."""

    __tablename__ = "blob_chunks"

    sha256: Mapped[str] = mapped_column(
        ForeignKey("blobs.sha256", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class WorkerSeen(Base):
    """A worker process and the model libraries its jobs can import (the upload page lists
    them: workers may run on other hosts, with other packages than the web process)."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)  # host:pid
    libraries: Mapped[dict] = mapped_column(JSONType)  # {"torch": "2.13.0", "timm": ...}
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    seen_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
