"""Migrations create the schema the models describe, on SQLite and on Postgres, and undo it;
rows keep UTC datetimes, JSON and cascading tags on both."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from api_support import BACKENDS, database
from sqlalchemy import func, inspect, select

from server.db import downgrade_database, make_engine, make_session_factory, session_scope
from server.models import Base, Job, Tag

TABLES = {"alembic_version", "jobs", "tags", "uploads", "api_tokens", "upload_events"}
TABLES |= {"blobs", "blob_chunks"}  # the database blob store (INSPECTOR_BLOB_STORE=database)
TABLES |= {"workers"}  # which model libraries each live worker offers (the upload page)


@pytest.fixture(params=BACKENDS)
def url(request, tmp_path):
    with database(request.param, tmp_path) as url:
        yield url


def test_upgrade_matches_the_models_and_downgrade_undoes_it(url):
    engine = make_engine(url)
    try:
        assert set(inspect(engine).get_table_names()) == TABLES
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []  # the migration and the models agree
        downgrade_database(url)
        assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    finally:
        engine.dispose()


def test_rows_round_trip(url):
    engine = make_engine(url)
    factory = make_session_factory(engine)
    when = dt.datetime(2024, 5, 1, 14, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    try:
        with session_scope(factory) as session:
            job = Job(name="n", upload_sha256="0" * 64, upload_filename="m.py", upload_kind="py",
                      entrypoint="m.py:Net", options={"fake": True}, started_at=when,
                      report_json={"totals": {"params": 2**40}, "x": [1.5, None]})  # fmt: skip
            job.tags = [Tag(key="branch", value="main"), Tag(key="commit", value="abc")]
            session.add(job)
        with session_scope(factory) as session:
            job = session.scalar(select(Job))
            assert job.started_at == when and job.started_at.utcoffset() == dt.timedelta(0)
            assert job.created_at.tzinfo is not None
            assert job.report_json == {"totals": {"params": 2**40}, "x": [1.5, None]}
            assert (job.status, job.progress, job.attempts, job.options) == (
                "queued",
                0,
                0,
                {"fake": True},
            )
            assert len(job.slug) == 22  # token_urlsafe(16): 16 bytes -> 22 base64 characters
            session.delete(job)
        with session_scope(factory) as session:
            assert session.scalar(select(func.count(Tag.id))) == 0
    finally:
        engine.dispose()


@pytest.mark.slow  # two fresh interpreters importing alembic and sqlalchemy
def test_alembic_command_line_on_sqlite(tmp_path):
    db = tmp_path / "cli.db"
    env = {**os.environ, "INSPECTOR_DATABASE_URL": f"sqlite:///{db}"}
    alembic = [sys.executable, "-m", "alembic"]
    subprocess.run(
        [*alembic, "upgrade", "head"], check=True, env=env, capture_output=True, timeout=60
    )
    engine = make_engine(f"sqlite:///{db}")
    assert set(inspect(engine).get_table_names()) == TABLES
    subprocess.run(
        [*alembic, "downgrade", "base"], check=True, env=env, capture_output=True, timeout=60
    )
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    engine.dispose()


def test_db_upgrade_command(tmp_path, monkeypatch, capsys):
    from server import cli_commands
    from server.settings import get_settings

    monkeypatch.setenv("INSPECTOR_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    try:
        assert cli_commands.db_upgrade() == 0
        assert "is up to date" in capsys.readouterr().out
        engine = make_engine(f"sqlite:///{tmp_path / 'inspector.db'}")
        assert set(inspect(engine).get_table_names()) == TABLES
        engine.dispose()
        monkeypatch.setenv("INSPECTOR_JOB_MEMORY_BYTES", "1MiB")
        get_settings.cache_clear()
        assert cli_commands.db_upgrade() == 2
        assert "below 2GiB" in capsys.readouterr().err
    finally:
        get_settings.cache_clear()
