"""`GET /readyz` (may this instance take traffic?) and `GET /metrics` (Prometheus text 0.0.4).

Metrics are read from the database and the queue at scrape time, not counted in this
process: with many web and worker processes any one of them gives the same, whole answer.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy import Engine, case, func, select, text

from inspector.schema.statuses import JOB_STATUSES
from server.models import Job

__all__ = ["router", "readiness", "metrics_text", "DURATION_BUCKETS_S"]

router = APIRouter(tags=["operations"])
PROM_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS_S = (1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
KILL_CAUSES = ("timed_out", "out_of_memory", "killed")  # the sandbox's watchdogs


@lru_cache(maxsize=1)
def migration_head() -> str | None:
    from alembic.script import ScriptDirectory

    from server.db import alembic_config

    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def _check_database(engine: Engine) -> str:
    try:
        with engine.connect() as conn:
            current = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except Exception as exc:
        return f"error: {type(exc).__name__}"
    head = migration_head()
    if current != head:
        return f"error: schema at {current}, migrations head is {head}: run `inspector db upgrade`"
    return "ok"


def _check_queue(settings: Any) -> str:
    try:
        from server.queue import get_huey

        get_huey(settings).pending_count()
    except Exception as exc:
        return f"error: {type(exc).__name__}"
    return "ok"


def readiness(engine: Engine, settings: Any) -> dict[str, str]:
    return {"database": _check_database(engine), "queue": _check_queue(settings)}


@router.get("/readyz", include_in_schema=False)  # for orchestrators, not API users
def readyz(request: Request) -> JSONResponse:
    """200 when the database answers at the migrations head and the queue answers; else 503."""
    checks = readiness(request.app.state.engine, request.app.state.settings)
    ok = all(v == "ok" for v in checks.values())
    body = {"status": "ready" if ok else "not_ready", **checks}
    return JSONResponse(body, status_code=200 if ok else 503)


def _duration_s(dialect: str):  # noqa: ANN202 - a SQL expression
    if dialect == "postgresql":
        return func.extract("epoch", Job.finished_at - Job.started_at)
    return (func.julianday(Job.finished_at) - func.julianday(Job.started_at)) * 86400.0


def _histogram(conn: Any, dialect: str) -> tuple[list[int], float, int]:
    duration = _duration_s(dialect)
    columns = [func.sum(case((duration <= b, 1), else_=0)) for b in DURATION_BUCKETS_S]
    columns += [func.sum(duration), func.count()]
    where = (Job.finished_at.is_not(None), Job.started_at.is_not(None))
    row = conn.execute(select(*columns).where(*where)).one()
    return [int(v or 0) for v in row[:-2]], float(row[-2] or 0.0), int(row[-1] or 0)


def _gauge(lines: list[str], name: str, help_: str, kind: str = "gauge") -> None:
    lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]


def metrics_text(engine: Engine, settings: Any) -> str:
    """The Prometheus exposition (text format 0.0.4) of the whole deployment."""
    from server.queue import get_huey

    with engine.connect() as conn:
        by_status = dict(conn.execute(select(Job.status, func.count()).group_by(Job.status)).all())
        buckets, total_s, count = _histogram(conn, engine.dialect.name)
    try:
        depth = float(get_huey(settings).pending_count())
    except Exception:
        depth = float("nan")  # the queue is down: say "unknown", not 0
    lines: list[str] = []
    _gauge(lines, "inspector_queue_depth", "Job messages waiting in the queue.")
    lines.append(f"inspector_queue_depth {depth}")
    _gauge(lines, "inspector_jobs", "Jobs in the database by status.")
    lines += [f'inspector_jobs{{status="{s}"}} {by_status.get(s, 0)}' for s in JOB_STATUSES]
    _gauge(lines, "inspector_job_duration_seconds", "Run time (claim to end).", "histogram")
    for bound, n in zip(DURATION_BUCKETS_S, buckets, strict=True):
        lines.append(f'inspector_job_duration_seconds_bucket{{le="{float(bound)}"}} {n}')
    lines.append(f'inspector_job_duration_seconds_bucket{{le="+Inf"}} {count}')
    lines.append(f"inspector_job_duration_seconds_sum {total_s}")
    lines.append(f"inspector_job_duration_seconds_count {count}")
    _gauge(lines, "inspector_sandbox_kills_total", "Jobs the sandbox stopped, by cause.", "counter")
    lines += [
        f'inspector_sandbox_kills_total{{cause="{c}"}} {by_status.get(c, 0)}' for c in KILL_CAUSES
    ]
    return "\n".join(lines) + "\n"


@router.get("/metrics", response_class=PlainTextResponse, include_in_schema=False)
def metrics(request: Request) -> PlainTextResponse:
    try:
        body = metrics_text(request.app.state.engine, request.app.state.settings)
    except Exception as exc:  # the database is down: a scrape failure, not a crash
        body = f"# database unavailable: {type(exc).__name__}\n"
        return PlainTextResponse(body, status_code=503, media_type=PROM_TYPE)
    return PlainTextResponse(body, media_type=PROM_TYPE)
