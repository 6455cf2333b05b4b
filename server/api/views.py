"""A job row as the API shows it: the same fields for the list, the detail and compare."""

from __future__ import annotations

from fastapi import Request

from server.api.schemas import CompareSide, ReportDetail, ReportRow
from server.models import Job

__all__ = ["base_url", "job_urls", "row", "detail", "side"]


def base_url(request: Request) -> str:
    """The configured public URL, else the one the client used."""
    public = request.app.state.settings.public_url
    return public or str(request.base_url).rstrip("/")


def job_urls(request: Request, slug: str) -> dict[str, str]:
    base = base_url(request)
    return {"url": f"{base}/r/{slug}", "api_url": f"{base}/api/v1/reports/{slug}"}


def _row_fields(request: Request, job: Job) -> dict:
    return {
        "slug": job.slug,
        "name": job.name,
        "status": job.status,
        "stage": job.stage,
        "progress": job.progress,
        "created_at": job.created_at,
        "finished_at": job.finished_at,
        "tags": job.tag_dict,
        "upload_filename": job.upload_filename,
        "entrypoint": job.entrypoint,
        "params": job.params,
        "flops_forward": job.flops_forward,
        "train_peak_bytes": job.train_peak_bytes,
        "forward_peak_bytes": job.forward_peak_bytes,
        "findings_errors": job.findings_errors,
        "findings_warnings": job.findings_warnings,
        "capture_method": job.capture_method,
        "error_kind": job.error_kind,
        **job_urls(request, job.slug),
    }


def row(request: Request, job: Job) -> ReportRow:
    return ReportRow(**_row_fields(request, job))


def _error(job: Job) -> dict | None:
    if job.error_json:
        return job.error_json
    if job.error_kind or job.error_message:
        return {"kind": job.error_kind, "message": job.error_message}
    return None


def detail(
    request: Request, job: Job, queue_position: int | None, *, with_report: bool = True
) -> ReportDetail:
    return ReportDetail(
        **_row_fields(request, job),
        error=_error(job),
        report=job.report_json if with_report else None,
        queue_position=queue_position,
        started_at=job.started_at,
        options=job.options or {},
        input_spec=job.input_spec,
        input_filename=job.input_filename,
        attempts=job.attempts,
        reused_from=job.reused_from,
    )


def side(request: Request, job: Job) -> CompareSide:
    url = job_urls(request, job.slug)["url"]
    return CompareSide(
        slug=job.slug, name=job.name, created_at=job.created_at, tags=job.tag_dict, url=url
    )
