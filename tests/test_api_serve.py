"""`serve` migrates, answers HTTP with an embedded worker, and stops cleanly on SIGINT/SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            return httpx.get(f"{url}/healthz", timeout=2).json()
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError("the server did not answer /healthz")


@pytest.mark.slow  # ~7 s each: a real process, migrations, the sandbox probe
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_serve_starts_and_stops_cleanly(tmp_path, signum):
    port = _free_port()
    env = {**os.environ, "INSPECTOR_DATA_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    code = f"from server.cli_commands import serve; raise SystemExit(serve('127.0.0.1', {port}))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        health = _wait_healthy(f"http://127.0.0.1:{port}", proc)
        assert health["database"] == "ok"
        assert (tmp_path / "inspector.db").exists()  # migrated at start
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert "embedded worker" in stderr  # started (or refused loudly), then stopped with the server
