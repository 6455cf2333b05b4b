"""`GET /readyz` (may this instance take traffic?) and `GET /metrics` (Prometheus text 0.0.4).

Metrics are read from the database and the queue at scrape time, not counted in this
process: with many web and worker processes any one of them gives the same, whole answer.
`prometheus_client` writes them, from a custom collector (`DeploymentCollector`).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from inspector.schema.statuses import JOB_STATUSES
from server.api import queries

__all__ = [
    "router",
    "readiness",
    "DeploymentCollector",
    "metrics_registry",
    "metrics_text",
    "DURATION_BUCKETS_S",
]

router = APIRouter(tags=["operations"])
# What generate_latest writes (prometheus_client >= 0.22 names it CONTENT_TYPE_PLAIN_0_0_4).
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


class DeploymentCollector:
    """The whole deployment's figures, read from the database and the queue per scrape."""

    def __init__(self, session_factory: sessionmaker[Session], settings: Any) -> None:
        self.session_factory = session_factory
        self.settings = settings

    def describe(self) -> Iterator[Metric]:
        # The names without a database read: registering the collector reads nothing.
        return iter(_families())

    def collect(self) -> Iterator[Metric]:
        with self.session_factory() as session:
            by_status = queries.count_by_status(session)
            buckets, total_s, count = queries.run_time_histogram(session, bounds=DURATION_BUCKETS_S)
        depth, jobs, durations, kills = _families()
        depth.add_metric([], self._queue_depth())
        for status in JOB_STATUSES:
            jobs.add_metric([status], by_status.get(status, 0))
        bounds = [str(float(b)) for b in DURATION_BUCKETS_S] + ["+Inf"]
        durations.add_metric([], list(zip(bounds, [*buckets, count], strict=True)), total_s)
        for cause in KILL_CAUSES:
            kills.add_metric([cause], by_status.get(cause, 0))
        return iter((depth, jobs, durations, kills))

    def _queue_depth(self) -> float:
        from server.queue import get_huey

        try:
            return float(get_huey(self.settings).pending_count())
        except Exception:
            return float("nan")  # the queue is down: say "unknown", not 0


def _families() -> tuple[Metric, ...]:
    return (
        GaugeMetricFamily("inspector_queue_depth", "Job messages waiting in the queue."),
        GaugeMetricFamily("inspector_jobs", "Jobs in the database by status.", labels=["status"]),
        HistogramMetricFamily("inspector_job_duration_seconds", "Run time (claim to end)."),
        CounterMetricFamily(
            "inspector_sandbox_kills_total",
            "Jobs the sandbox stopped, by cause.",
            labels=["cause"],
        ),
    )


def metrics_registry(session_factory: sessionmaker[Session], settings: Any) -> CollectorRegistry:
    """A registry of this app's own (not the process-global one): one app, one deployment."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DeploymentCollector(session_factory, settings))
    return registry


def metrics_text(registry: CollectorRegistry) -> str:
    """The Prometheus exposition (text format 0.0.4) of the whole deployment."""
    return generate_latest(registry).decode()


@router.get("/metrics", response_class=PlainTextResponse, include_in_schema=False)
def metrics(request: Request) -> PlainTextResponse:
    """Prometheus metrics of the whole deployment; no credentials asked, as before."""
    try:
        body = metrics_text(request.app.state.metrics)
    except Exception as exc:  # the database is down: a scrape failure, not a crash
        body = f"# database unavailable: {type(exc).__name__}\n"
        return PlainTextResponse(body, status_code=503, media_type=PROM_TYPE)
    return PlainTextResponse(body, media_type=PROM_TYPE)
