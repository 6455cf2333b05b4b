"""A real `inspector serve` process (web server + embedded worker + real sandbox) for the
end-to-end and hostile-upload tests, and the HTTP calls they make against it."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent.parent
FINAL = ("done", "failed", "timed_out", "out_of_memory", "killed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(data_dir: Path, **env: str) -> Iterator[str]:
    """Start `serve` with INSPECTOR_* `env`; yields its base URL; stops it with SIGTERM."""
    port = free_port()
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "INSPECTOR_DATA_DIR": str(data_dir)}
    full_env.update(env)
    code = f"from server.cli_commands import serve; raise SystemExit(serve('127.0.0.1', {port}))"
    log = open(data_dir.parent / f"serve-{port}.log", "w+b")  # noqa: SIM115 - read at the end
    proc = subprocess.Popen([sys.executable, "-c", code], env=full_env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        _LOGS[url] = log
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _LOGS.pop(url, None)
        log.close()


_LOGS: dict = {}  # base URL -> its serve log, for a failure's message


def serve_log_tail(url: str, chars: int = 6000) -> str:
    """The end of the serve process's log (the worker's and its zygotes' lines)."""
    log = _LOGS.get(url)
    if log is None:
        return "(no log)"
    log.flush()
    with open(log.name, "rb") as f:
        return f.read().decode(errors="replace")[-chars:]


def _wait_healthy(url: str, proc: subprocess.Popen, log) -> None:  # noqa: ANN001
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise AssertionError(f"serve exited: {log.read().decode(errors='replace')[-3000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError("serve did not answer /healthz")


def upload(
    url: str,
    model: bytes,
    *,
    filename: str = "model.py",
    entrypoint: str | None = "model.py:Net",
    input_file: tuple[str, bytes] | None = None,
    **form: str,
) -> httpx.Response:
    files = {"model": (filename, model)}
    if input_file is not None:
        files["input_file"] = input_file
    data = dict(form)
    if entrypoint:
        data["entrypoint"] = entrypoint
    return httpx.post(f"{url}/api/v1/reports", files=files, data=data, timeout=60)


def wait_final(url: str, slug: str, timeout_s: float = 240) -> dict:
    return wait_all_final(url, {slug: slug}, timeout_s)[slug]


def wait_all_final(url: str, slugs: dict[str, str], timeout_s: float) -> dict[str, dict]:
    """{name: final body} for every report, under one deadline; past it, the failure names
    each report still running with its status and stage, and ends with the serve log."""
    bodies: dict[str, dict] = {}
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=30) as client:  # one client: no TLS context per poll
        while True:
            for name, slug in slugs.items():
                if name not in bodies or bodies[name].get("status") not in FINAL:
                    bodies[name] = client.get(f"{url}/api/v1/reports/{slug}").json()
            pending = {n: b for n, b in bodies.items() if b.get("status") not in FINAL}
            if not pending:
                return bodies
            if time.monotonic() >= deadline:
                break
            time.sleep(0.25)
    lines = [f"{n}: {b.get('status')}, stage {b.get('stage')}" for n, b in pending.items()]
    raise AssertionError(
        f"{len(pending)} of {len(slugs)} reports did not finish in {timeout_s:g} s:\n"
        + "\n".join(lines) + "\n--- serve log ---\n" + serve_log_tail(url)
    )  # fmt: skip


@dataclass
class HealthWatch:
    """Polls /healthz in the background: the service must keep answering throughout."""

    url: str
    failures: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> HealthWatch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            start = time.monotonic()
            try:
                code = httpx.get(f"{self.url}/healthz", timeout=10).status_code
                if code != 200:
                    self.failures.append(f"HTTP {code}")
            except httpx.HTTPError as exc:
                self.failures.append(repr(exc))
            self.latencies.append(time.monotonic() - start)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)
