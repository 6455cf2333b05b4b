"""Service settings: defaults, environment, URL normalisation, unsafe combinations."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from server.settings import Settings, get_settings, normalise_database_url


def test_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Settings()
    assert s.data_dir == tmp_path / "inspector-data"
    assert s.database_url == f"sqlite:///{tmp_path}/inspector-data/inspector.db"
    assert s.redis_url is None and s.sandbox == "bwrap" and s.trusted_only is False
    assert s.max_upload_bytes == 100 * 1024**2 and s.max_zip_files == 2000
    assert s.job_memory_bytes == 8 * 1024**3 and s.worker_concurrency == 1


def test_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("INSPECTOR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("INSPECTOR_DATABASE_URL", "postgres://u:p%40ss@db:5432/insp")
    monkeypatch.setenv("INSPECTOR_MAX_UPLOAD_BYTES", "10MiB")
    monkeypatch.setenv("INSPECTOR_PUBLIC_URL", "https://inspector.example.com/")
    monkeypatch.setenv("INSPECTOR_REDIS_URL", "")
    s = Settings()
    assert s.data_dir == tmp_path
    assert s.database_url == "postgresql+psycopg://u:p%40ss@db:5432/insp"
    assert s.max_upload_bytes == 10 * 1024**2
    assert s.public_url == "https://inspector.example.com"
    assert s.redis_url is None


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://h/db", "postgresql+psycopg://h/db"),
        ("postgresql+psycopg2://h/db", "postgresql+psycopg://h/db"),
        ("postgresql+psycopg://h/db", "postgresql+psycopg://h/db"),
        ("sqlite:////x/y.db", "sqlite:////x/y.db"),
    ],
)
def test_normalise_database_url(url, expected):
    assert normalise_database_url(url) == expected


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"trusted_only": True}, "only applies with INSPECTOR_SANDBOX=none"),
        ({"job_memory_bytes": "1GiB"}, "below 2GiB"),
        ({"worker_concurrency": 0}, "INSPECTOR_WORKER_CONCURRENCY must be positive"),
        ({"public_url": "inspector.local"}, "must start with http"),
        ({"sandbox": "docker"}, "sandbox"),
    ],
)
def test_unsafe_settings_are_refused(kwargs, expected):
    with pytest.raises(ValidationError, match=expected):
        Settings(**kwargs)


def test_trusted_only_with_no_sandbox_is_allowed():
    assert Settings(sandbox="none", trusted_only=True).trusted_only


def test_get_settings_is_cached(monkeypatch, tmp_path):
    get_settings.cache_clear()
    monkeypatch.setenv("INSPECTOR_DATA_DIR", str(tmp_path))
    try:
        assert get_settings() is get_settings()
        assert get_settings().data_dir == tmp_path
    finally:
        get_settings.cache_clear()
