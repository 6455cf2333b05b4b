"""Helpers for the API tests: a real app on SQLite or on a fresh Postgres schema, a fake
queue that records what was enqueued, hand-built reports and a stand-in for the worker."""

from __future__ import annotations

import secrets
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import POSTGRES_URL, require_service
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from inspector.report import Finding, Memory, Module, Report, Totals
from server.app import create_app
from server.db import upgrade_database
from server.models import Job, utcnow
from server.settings import Settings
from server.summary import summary_columns

BACKENDS = ["sqlite", "postgres"]

MLP_SOURCE = b"""\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def build():
    return Net()
"""
SPEC = '{"x": {"shape": ["B", 8]}, "dims": {"B": 2}}'


@dataclass
class Env:
    client: TestClient
    settings: Settings
    factory: sessionmaker[Session]
    backend: str
    enqueued: list[int] = field(default_factory=list)

    def job(self, slug: str) -> Job | None:
        with self.factory() as session:
            job = session.scalar(select(Job).where(Job.slug == slug))
            if job is not None:
                _ = job.tags  # load before the session closes
            return job


@contextmanager
def database(backend: str, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database: a SQLite file, or a fresh schema in the shared `test` db."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'api.db'}"
        upgrade_database(url)
        yield url
        return
    require_service("PostgreSQL", "127.0.0.1", 5432)
    schema = f"h4test_{secrets.token_hex(6)}"
    admin = create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    url_text = url.render_as_string(hide_password=False)
    try:
        upgrade_database(url_text)
        yield url_text
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def fake_queue(monkeypatch: Any, enqueued: list[int], fail: bool = False) -> None:
    """Stand in for the worker engineer's `server.queue`: record job ids (or fail)."""

    def enqueue_job(job_id: int, settings: Settings) -> None:
        if fail:
            raise ConnectionError("queue unreachable")
        enqueued.append(job_id)

    module = types.ModuleType("server.queue")
    module.enqueue_job = enqueue_job  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "server.queue", module)


@contextmanager
def api_env(backend: str, tmp_path: Path, monkeypatch: Any, **overrides: Any) -> Iterator[Env]:
    with database(backend, tmp_path) as url:
        options = {"sandbox": "none", "trusted_only": True} | overrides
        settings = Settings(data_dir=tmp_path / "data", database_url=url, **options)
        app = create_app(settings)
        env = Env(TestClient(app), settings, app.state.session_factory, backend)
        fake_queue(monkeypatch, env.enqueued)
        try:
            yield env
        finally:
            app.state.engine.dispose()


def upload(
    env: Env,
    source: bytes = MLP_SOURCE,
    filename: str = "model.py",
    data: dict[str, Any] | None = None,
    input_file: tuple[str, bytes] | None = None,
) -> Any:
    fields = {"entrypoint": f"{filename}:Net", "input": SPEC} | (data or {})
    files: dict[str, Any] = {"model": (filename, source, "application/octet-stream")}
    if input_file:
        files["input_file"] = (input_file[0], input_file[1], "application/octet-stream")
    return env.client.post("/api/v1/reports", data=fields, files=files)


def mlp_report(hidden: int = 16, warnings: int = 0) -> Report:
    """The MLP above (Linear(8, hidden) -> ReLU -> Linear(hidden, 4)) at batch 2, by hand."""
    fc1 = 8 * hidden + hidden  # weight + bias
    fc2 = hidden * 4 + 4
    flops = 2 * 2 * 8 * hidden + 2 * 2 * hidden * 4  # 2 * B * in * out per Linear
    modules = [
        Module(path="", type="Net", params=fc1 + fc2, output_shapes=[["B", 4]]),
        Module(path="fc1", type="Linear", params=fc1, output_shapes=[["B", hidden]]),
        Module(path="fc2", type="Linear", params=fc2, output_shapes=[["B", 4]]),
    ]
    findings = [
        Finding(rule=f"rule-{i}", severity="warning", where="fc1", message="m")
        for i in range(warnings)
    ]
    param_bytes = 4 * (fc1 + fc2)  # float32
    return Report(
        totals=Totals(params=fc1 + fc2, trainable_params=fc1 + fc2, flops_forward=flops),
        modules=modules,
        memory=Memory(
            param_bytes=param_bytes,
            train_peak_bytes=4 * param_bytes,
            forward_peak_bytes=param_bytes,
        ),
        findings=findings,
    )


def finish(
    env: Env, slug: str, report: Report | None = None, status: str = "done", **cols: Any
) -> None:
    """Do what the worker does when a job ends: report, summary columns, status."""
    with env.factory() as session:
        job = session.scalar(select(Job).where(Job.slug == slug))
        assert job is not None
        job.status, job.finished_at, job.progress = status, utcnow(), 100
        if report is not None:
            job.report_json = report.model_dump(mode="json")
            for key, value in summary_columns(job.report_json).items():
                setattr(job, key, value)
        for key, value in cols.items():
            setattr(job, key, value)
        session.commit()
