"""Response models of API v1 (they are the OpenAPI documentation too)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, Field


class CreatedReport(BaseModel):
    slug: str
    status: str
    reused_from: str | None = Field(
        None, description="the done report whose result this one reuses (same bytes, options)"
    )
    url: str = Field(description="the report page, for people")
    api_url: str = Field(description="this report in the API, for machines")


class ReportRow(BaseModel):
    """A job with its summary figures: one row of the list."""

    slug: str
    name: str
    status: str
    stage: str | None
    progress: int
    created_at: dt.datetime
    finished_at: dt.datetime | None
    tags: dict[str, str]
    upload_filename: str
    entrypoint: str
    params: int | None
    flops_forward: int | None
    train_peak_bytes: int | None
    forward_peak_bytes: int | None
    findings_errors: int
    findings_warnings: int
    capture_method: str | None
    error_kind: str | None
    url: str
    api_url: str


class ReportDetail(ReportRow):
    """A job's status, and the whole report once done."""

    error: dict[str, Any] | None = Field(description="kind, message, stage, traceback")
    report: dict[str, Any] | None = Field(description="the Report (inspector/report.py)")
    queue_position: int | None = Field(description="1 = next to run; None unless queued")
    started_at: dt.datetime | None
    options: dict[str, Any]
    input_spec: str | None
    input_filename: str | None
    attempts: int
    reused_from: str | None = Field(
        None, description="the done report whose result this one reuses (same bytes, options)"
    )


class ReportList(BaseModel):
    items: list[ReportRow]
    total: int
    limit: int
    offset: int
    next_offset: int | None = Field(description="offset of the next page, None on the last")


class CompareSide(BaseModel):
    slug: str
    name: str
    created_at: dt.datetime
    tags: dict[str, str]
    url: str


class Comparison(BaseModel):
    a: CompareSide
    b: CompareSide
    summary: dict[str, dict[str, Any]] = Field(
        description="figure -> {a, b, delta, percent, direction}; percent relative to a"
    )
    max_batch: dict[str, dict[str, Any]]
    modules: dict[str, Any] = Field(description="added, removed, changed, unchanged")
    findings: dict[str, list[dict[str, Any]]] = Field(description="added, resolved")
    drift: list[dict[str, Any]] = Field(
        default_factory=list,
        description="versions and options that differ: key, label, a, b (torch, dtype, ...)",
    )


class Health(BaseModel):
    status: str
    database: str
    sandbox: str
    sandbox_message: str
    trusted_only: bool


class ErrorBody(BaseModel):
    code: str
    message: str
    detail: Any = None


class ErrorResponse(BaseModel):
    error: ErrorBody
