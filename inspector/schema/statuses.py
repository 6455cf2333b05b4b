"""Job statuses and the failure kinds that lead to them (DESIGN.md "Errors and messages")."""

from __future__ import annotations

__all__ = [
    "JOB_STATUSES",
    "RUNNING_STATUSES",
    "FINAL_STATUSES",
    "FAILURE_KINDS",
    "STATUS_OF_KIND",
    "status_label",
]

RUNNING_STATUSES = ("queued", "running")
FINAL_STATUSES = ("done", "failed", "timed_out", "out_of_memory", "killed")
JOB_STATUSES = RUNNING_STATUSES + FINAL_STATUSES

# error.kind of a failed job -> the job's status
STATUS_OF_KIND = {
    "user_error": "failed",
    "internal": "failed",
    "out_of_memory": "out_of_memory",
    "timed_out": "timed_out",
    "killed": "killed",
}
FAILURE_KINDS = tuple(STATUS_OF_KIND)


def status_label(status: str | None) -> str:
    """'out_of_memory' -> 'out of memory', as people read it."""
    return (status or "").replace("_", " ")
