"""`GET /healthz`: the database answers, and whether uploads are accepted."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from server.api.dispatch import sandbox_state
from server.api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz(request: Request) -> JSONResponse:
    """Liveness: 200 whenever this process answers (a database outage must not get the
    server restarted); the database and sandbox states are reported. Readiness: /readyz."""
    settings = request.app.state.settings
    try:
        with request.app.state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        database = "ok"
    except Exception as exc:  # report, don't crash: this is what monitoring polls
        database = f"error: {type(exc).__name__}"
    ok, why = sandbox_state(settings)
    body = Health(
        status="ok" if database == "ok" else "degraded",
        database=database,
        sandbox="ok" if ok else "unavailable",
        sandbox_message=why,
        trusted_only=settings.trusted_only,
    )
    return JSONResponse(body.model_dump(), status_code=200)
