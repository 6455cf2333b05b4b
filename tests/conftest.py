"""Shared test set-up: the test models on sys.path, and the real-service guards."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

import inspector  # noqa: F401  first: its import hook keeps torchvision importable (compat)

TESTS = Path(__file__).parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))

IN_CI = os.environ.get("CI", "").lower() == "true"
POSTGRES_URL = os.environ.get(
    "INSPECTOR_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("INSPECTOR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip when a real service is absent, except in CI where it must be there."""
    if _port_open(host, port):
        return
    message = f"{name} is not listening on {host}:{port}"
    if IN_CI:
        pytest.fail(f"{message}, and CI=true requires it")
    pytest.skip(message)


@pytest.fixture
def postgres_url() -> str:
    require_service("PostgreSQL", "127.0.0.1", 5432)
    return POSTGRES_URL


@pytest.fixture
def redis_url() -> str:
    require_service("Redis", "127.0.0.1", 6379)
    return REDIS_URL


def pytest_sessionstart(session: pytest.Session) -> None:
    """In CI the real sandbox and browser must be there: tests that need them would
    otherwise skip and a green run would prove nothing about them."""
    if not IN_CI:
        return
    from server.sandbox import sandbox_available

    ok, why = sandbox_available()
    if not ok:
        raise pytest.UsageError(f"CI=true requires the bubblewrap sandbox: {why}")
    if not Path("/usr/bin/chromium").exists():
        raise pytest.UsageError("CI=true requires /usr/bin/chromium (make system-deps)")


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright (tests/browser_support.py), one per module."""
    from browser_support import chromium

    with chromium() as b:
        yield b


@pytest.fixture
def page(browser):
    """A fresh page that fails the test on any uncaught script error."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    context.close()
    assert not errors, errors


@pytest.fixture
def dispatched(monkeypatch) -> list:
    """The ops that reach the fake mode's own dispatch (its device queries aside): what a
    shortcut in front of it (inspector/fakeviews.py, fakememo.py) kept from it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen = []
    real_dispatch = FakeTensorMode.dispatch

    def noted(self, func, types, args=(), kwargs=None):
        if func is not torch.ops.prim.device.default:
            seen.append(func)
        return real_dispatch(self, func, types, args, kwargs)

    monkeypatch.setattr(FakeTensorMode, "dispatch", noted)
    return seen
