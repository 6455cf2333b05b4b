"""The real app on a loopback port for browser tests and the web benchmark, with jobs
inserted straight into its database (no worker needed)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from sqlalchemy.orm import Session, sessionmaker

from inspector.report import Report
from server.app import create_app
from server.db import make_engine, make_session_factory, upgrade_database
from server.models import Job, Tag, utcnow
from server.settings import Settings
from server.summary import summary_columns


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """SQLite in `data_dir`, migrated; the sandbox setting does not matter for pages."""
    settings = Settings(data_dir=data_dir, **overrides)
    upgrade_database(settings.database_url)
    return settings


def insert_job(
    factory: sessionmaker[Session],
    report: Report | None,
    *,
    name: str,
    status: str = "done",
    tags: dict[str, str] | None = None,
    **columns: Any,
) -> str:
    """A job row as the worker would leave it; returns its slug."""
    data = report.model_dump(mode="json") if report is not None else None
    fields: dict[str, Any] = dict(
        name=name, status=status, upload_sha256="0" * 64, upload_filename="model.py",
        upload_kind="py", entrypoint="model.py:Net", options={}, report_json=data,
        progress=100 if status == "done" else 0, finished_at=utcnow(),
    )  # fmt: skip
    if data is not None:
        fields.update(summary_columns(data))
    fields.update(columns)
    with factory() as session:
        job = Job(**fields)
        job.tags = [Tag(key=k, value=v) for k, v in (tags or {}).items()]
        session.add(job)
        session.commit()
        return job.slug


@dataclass
class LiveServer:
    url: str
    settings: Settings
    factory: sessionmaker[Session]

    def insert(self, report: Report | None, **kwargs: Any) -> str:
        return insert_job(self.factory, report, **kwargs)


@contextmanager
def live_server(settings: Settings) -> Iterator[LiveServer]:
    """uvicorn in a thread on a free port; stopped on exit."""
    port = free_port()
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    factory = make_session_factory(make_engine(settings.database_url))
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", settings, factory)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
