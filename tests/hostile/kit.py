"""Helpers for the worker, end-to-end and hostile-upload tests: settings in a temp dir,
a migrated database, jobs added the way the API adds them, and a throwaway Postgres db."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from server.db import session_scope, upgrade_database
from server.jobs import session_factory_for
from server.models import Job, Upload
from server.settings import Settings
from server.storage import UploadStore

GiB = 1024**3
TINY_MODEL = b"""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x).relu()


def example_inputs():
    return (torch.randn(2, 8),)
"""


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Short limits: the hostile children fail fast."""
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "job_timeout_s": 60,
        "job_memory_bytes": 3 * GiB,
        "job_cpu_s": 120,
        "job_max_procs": 32,
        "job_max_file_bytes": 64 * 1024**2,
        "job_output_bytes": 64 * 1024,
        "device": "cpu",
        "queue_name": f"test-{secrets.token_hex(4)}",
    }
    values.update(overrides)
    settings = Settings(**values)
    upgrade_database(str(settings.database_url))
    return settings


def add_job(
    settings: Settings,
    model: bytes = TINY_MODEL,
    *,
    filename: str = "model.py",
    entrypoint: str | None = "model.py:Net",
    kind: str = "py",
    input_spec: str | None = None,
    input_file: tuple[str, bytes] | None = None,
    options: dict[str, Any] | None = None,
) -> int:
    """A queued job row with its files in the store, as `POST /api/v1/reports` leaves it."""
    store = UploadStore(settings.data_dir)
    sha = store.put_bytes(model)
    input_sha = store.put_bytes(input_file[1]) if input_file else None
    factory = session_factory_for(str(settings.database_url))
    with session_scope(factory) as session:
        for digest, name, data, k in ((sha, filename, model, kind), _input_row(input_file)):
            if digest and session.get(Upload, digest) is None:
                session.add(Upload(sha256=digest, size_bytes=len(data), filename=name, kind=k))
        job = Job(
            name=filename, status="queued", upload_sha256=sha, upload_filename=filename,
            upload_kind=kind, entrypoint=entrypoint or filename, input_spec=input_spec,
            input_sha256=input_sha, input_filename=input_file[0] if input_file else None,
            options=options or {"optimizer": "adamw", "device": "cpu"},
        )  # fmt: skip
        session.add(job)
        session.flush()
        return job.id


def _input_row(input_file: tuple[str, bytes] | None) -> tuple:
    if input_file is None:
        return (None, None, None, None)
    import hashlib

    name, data = input_file
    return (hashlib.sha256(data).hexdigest(), name, data, name.rsplit(".", 1)[-1])


def get_job(settings: Settings, job_id: int) -> Job:
    factory = session_factory_for(str(settings.database_url))
    with session_scope(factory) as session:
        job = session.get(Job, job_id)
        assert job is not None
        session.expunge(job)
        return job


@contextlib.contextmanager
def fresh_postgres(base_url: str) -> Iterator[str]:
    """A new, empty database on the test server, dropped afterwards."""
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"inspector_h5_{secrets.token_hex(4)}"
    url = make_url(base_url)
    admin = url.set(drivername="postgresql", database="postgres").render_as_string(False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        session_factory_for.cache_clear()  # close nothing else's engine; ours are dropped
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
