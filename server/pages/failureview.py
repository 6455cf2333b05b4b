"""The view model of a job that did not finish: what went wrong, where, and what to do."""

from __future__ import annotations

from typing import Any

from inspector.report import Report
from server.models import Job

__all__ = ["ERROR_ADVICE", "error_of", "unreadable"]

# What a user can do about each kind of failure.
ERROR_ADVICE = {
    "user_error": "The error is in the uploaded code or input: fix it and upload again.",
    "timed_out": "The job ran past the time limit: try a smaller input, or fake tensors.",
    "out_of_memory": "The job ran out of memory: try a smaller batch, or fake tensors.",
    "killed": "The job was stopped by the sandbox; the reason is above.",
    "internal": "This is a bug in the inspector, not in your model: re-run, or report it.",
}


def error_of(job: Job, report: Report | None) -> dict[str, Any]:
    """The job's error: its stored error JSON, else the report's, else its columns."""
    error = dict(job.error_json or {})
    if not error and report is not None and report.error is not None:
        error = report.error.model_dump()
    error.setdefault("kind", job.error_kind or job.status)
    error.setdefault("message", job.error_message or "The job did not finish.")
    error.setdefault("stage", job.stage)
    error["advice"] = ERROR_ADVICE.get(error["kind"], ERROR_ADVICE.get(job.status, ""))
    return error


def unreadable(job: Job) -> dict[str, Any]:
    """A done job whose report this version cannot read."""
    return {
        "kind": "internal",
        "message": "This report's data is missing or unreadable by this version.",
        "stage": None,
        "advice": ERROR_ADVICE["internal"],
    }
