"""The two calls out to the worker side: is there a sandbox, and enqueue a job.

Both modules belong to the worker engineer; their imports are guarded so the API still
answers (with a clear 503, or a job left `queued` for the sweep) when they are missing.
"""

from __future__ import annotations

import logging

from server import sandbox
from server.api.errors import ApiError
from server.settings import Settings

__all__ = ["require_sandbox", "sandbox_state", "enqueue"]

log = logging.getLogger("server.api")


def sandbox_state(settings: Settings) -> tuple[bool, str]:
    """(uploads accepted, why)."""
    if settings.trusted_only:
        return True, "trusted-only mode: uploads run WITHOUT a sandbox (operator's choice)"
    if settings.sandbox == "none":
        return False, (
            "uploads are refused: INSPECTOR_SANDBOX=none runs them unconfined. "
            "Install bubblewrap and set INSPECTOR_SANDBOX=bwrap, or, only for code you trust, "
            "set INSPECTOR_TRUSTED_ONLY=true"
        )
    ok, why = sandbox.sandbox_available()
    if ok:
        return True, why or "bwrap sandbox available"
    return False, (
        f"uploads are refused: no working sandbox on this server ({why}). "
        "An operator must fix the sandbox (bubblewrap with user namespaces)"
    )


def require_sandbox(settings: Settings) -> None:
    ok, why = sandbox_state(settings)
    if not ok:
        raise ApiError(503, "sandbox_unavailable", why)


def enqueue(job_id: int, settings: Settings) -> bool:
    """Hand the job to the queue; on failure it stays `queued` and the worker's sweep finds it."""
    try:
        from server.queue import enqueue_job

        enqueue_job(job_id, settings)
        return True
    except Exception:  # the upload and row are safe; only the hand-off failed
        log.exception("could not enqueue job %s; it stays queued for the sweep", job_id)
        return False
