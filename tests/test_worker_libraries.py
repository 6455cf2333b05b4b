"""The upload page says which model libraries the live workers' jobs can import: each
worker announces its installed versions in the database, stale workers drop out."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import time

from fastapi.testclient import TestClient
from pages_server import make_settings

from server.app import create_app
from server.db import make_engine, make_session_factory, session_scope
from server.models import WorkerSeen, utcnow
from server.worker import WorkerHandle, start_sweeper
from server.workers_seen import FRESH_S, announce_worker, libraries_on_offer, this_worker


def _factory(settings):
    return make_session_factory(make_engine(settings.database_url))


def test_live_workers_grouped_by_what_they_have(tmp_path):
    factory = _factory(make_settings(tmp_path))
    now = utcnow()
    old = now - dt.timedelta(seconds=FRESH_S + 1)
    with session_scope(factory) as session:
        session.add_all([
            WorkerSeen(id="a:1", libraries={"torch": "2.5.1"}, started_at=now, seen_at=now),
            WorkerSeen(id="b:1", libraries={"torch": "2.5.1"}, started_at=now, seen_at=now),
            WorkerSeen(id="c:1", libraries={"torch": "2.4.0", "timm": "1.0"}, started_at=now,
                       seen_at=now),
            WorkerSeen(id="gone:1", libraries={"torch": "1.0"}, started_at=old, seen_at=old),
        ])  # fmt: skip
    with session_scope(factory) as session:
        offers = libraries_on_offer(session, now=now)
    assert offers == [
        {"libraries": {"torch": "2.5.1"}, "workers": 2},
        {"libraries": {"timm": "1.0", "torch": "2.4.0"}, "workers": 1},
    ]


def test_announce_records_this_environments_versions(tmp_path):
    import torch

    factory = _factory(make_settings(tmp_path))
    with session_scope(factory) as session:
        announce_worker(session)
        announce_worker(session)  # a refresh, not a second row
    with session_scope(factory) as session:
        (row,) = session.query(WorkerSeen).all()
        assert row.id == this_worker()
        assert row.libraries["torch"] == torch.__version__
        for name in ("torchvision", "timm", "transformers"):
            try:
                version = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                version = None
            assert row.libraries.get(name) == version


def test_upload_page_lists_the_workers_libraries(tmp_path):
    settings = make_settings(tmp_path)
    with TestClient(create_app(settings)) as client:
        assert "No worker has reported in the last 5 minutes" in client.get("/").text
        with session_scope(_factory(settings)) as session:
            announce_worker(session)
        html = client.get("/").text
    assert "Your model can import" in html
    assert f"<code>torch {importlib.metadata.version('torch')}</code>" in html


def _rows(settings) -> list[str]:
    with session_scope(_factory(settings)) as session:
        return [row.id for row in session.query(WorkerSeen).all()]


def test_a_running_worker_announces_itself_and_a_bare_sweeper_does_not(tmp_path):
    settings = make_settings(tmp_path / "sweep")
    handle = start_sweeper(settings)
    time.sleep(1.0)
    handle.stop()
    assert _rows(settings) == []

    settings = make_settings(tmp_path / "work", worker_concurrency=1)
    handle = WorkerHandle(settings).start()
    try:
        deadline = time.monotonic() + 10
        while not _rows(settings) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        handle.stop()
    assert _rows(settings) == [this_worker()]
