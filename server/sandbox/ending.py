"""Name how a job ended: the child's outcome plus what it left in its folder -> a status,
an error (what was wrong, where, what to do) and the report to store."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from inspector.report import Report, failed_report
from inspector.schema.statuses import STATUS_OF_KIND
from server.sandbox.childfiles import read_child_file, read_child_json
from server.sandbox.runner import Outcome

__all__ = ["Ending", "failure", "ending_from_outcome"]

MAX_REPORT_BYTES = 64 * 1024**2
MAX_ERROR_BYTES = 1024**2
TEXT_CAP = 16 * 1024  # message and traceback as stored
OUTPUT_CAP = 4 * 1024  # the tail of the child's stdout/stderr kept with an error
ADVICE = {
    "timed_out": "Try fake tensors (fake=true) or a smaller input, or ask the operator "
    "to raise INSPECTOR_JOB_TIMEOUT_S.",
    "out_of_memory": "Try fake tensors (fake=true, no weights or activations allocated) or a "
    "smaller batch, or ask the operator to raise INSPECTOR_JOB_MEMORY_BYTES.",
    "killed": "The model's process was stopped: check that it runs on its own "
    "(python -c 'import model') and does not crash, fork or write without end.",
}
# faulthandler's dump: `  File "/job/upload/model.py", line 7 in build` (innermost first).
_FAULT_FRAME = re.compile(r'File "(?:/job/|.*?/)?(upload/[^"]+)", line (\d+)')


@dataclass
class Ending:
    status: str  # a job status, or "interrupted" (the worker stopped it: queue it again)
    stage: str | None = None
    error: dict[str, Any] | None = None
    report: dict[str, Any] | None = None  # the report to store (a failed one on failure)


def failure(kind: str, message: str, *, stage: str | None = None, **extra: Any) -> Ending:
    error = {"kind": kind, "message": message[:TEXT_CAP], "stage": stage}
    error.update({k: v for k, v in extra.items() if v})
    report = failed_report(kind, error["message"], stage, **{k: v for k, v in extra.items() if v})
    return Ending(STATUS_OF_KIND.get(kind, "failed"), stage, error, report.model_dump(mode="json"))


def _tail(text: str) -> str | None:
    return text[-OUTPUT_CAP:] if text.strip() else None


def _read_report(job_dir: Path) -> dict[str, Any] | None:
    data = read_child_file(job_dir / "report.json", MAX_REPORT_BYTES)
    if data is None:
        return None
    try:
        return Report.model_validate_json(data).model_dump(mode="json")
    except ValidationError:
        return None


def _from_error_file(outcome: Outcome, job_dir: Path, stage: str) -> Ending:
    raw = read_child_json(job_dir / "error.json", MAX_ERROR_BYTES)
    output = {"stdout": _tail(outcome.stdout), "stderr": _tail(outcome.stderr)}
    if raw is None or not isinstance(raw.get("message"), str):
        message = f"the job's process {outcome.reason} without saying why"
        return failure("internal", message, stage=stage, **output)
    kind = raw.get("kind") if raw.get("kind") in ("user_error", "out_of_memory") else "internal"
    trace = raw.get("traceback") if isinstance(raw.get("traceback"), str) else None
    where = raw.get("stage") if isinstance(raw.get("stage"), str) else stage
    advice = ADVICE.get(kind)
    message = raw["message"] + (f"\n{advice}" if advice else "")
    return failure(kind, message, stage=where[:64], traceback=(trace or "")[:TEXT_CAP], **output)


def crash_location(stderr: str) -> str | None:
    """ "model.py:7" from faulthandler's dump of a crash, when it shows a user frame."""
    match = _FAULT_FRAME.search(stderr)
    return f"{Path(match.group(1)).name}:{match.group(2)}" if match else None


def ending_from_outcome(outcome: Outcome, job_dir: Path, stage: str) -> Ending:
    if outcome.status == "interrupted":
        return Ending("interrupted", stage)
    if outcome.status == "done":
        report = _read_report(job_dir)
        if report is not None:
            return Ending("done", "done", None, report)
        message = "the job's process finished without a readable report"
        return failure("internal", message, stage=stage, stderr=_tail(outcome.stderr))
    if outcome.status == "failed":
        return _from_error_file(outcome, job_dir, stage)
    where = crash_location(outcome.stderr) if outcome.signal else None
    message = f"the job {outcome.reason} during {stage}" + (f" at {where}" if where else "")
    message += f". {ADVICE[outcome.status]}"
    return failure(
        outcome.status, message, stage=stage, signal=outcome.signal, location=where,
        stdout=_tail(outcome.stdout), stderr=_tail(outcome.stderr),
    )  # fmt: skip
