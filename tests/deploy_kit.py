"""A deployment on loopback for the load bench and the fault tests: one `inspector serve`
(no embedded worker) and N `inspector worker` processes sharing a database and a queue, and
a data dir (or each with its own, as workers on other hosts); a private Redis to stop and
start; a TCP proxy to cut Postgres off for a while.

Every process writes JSON logs to its own file; every wait is bounded in time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
FINAL = ("done", "failed", "timed_out", "out_of_memory", "killed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout_s: float, what: str, every_s: float = 0.2):  # noqa: ANN001, ANN201
    """Poll `predicate` until it returns something truthy; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@dataclass
class Cluster:
    """Processes of one deployment; `env` are the INSPECTOR_* settings they share."""

    data_dir: Path
    env: dict[str, str]
    server_env: dict[str, str] = field(default_factory=dict)  # the server's alone
    port: int = field(default_factory=free_port)
    server: subprocess.Popen | None = None
    workers: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(
        self, code: str, name: str, data_dir: Path | None = None, **extra: str
    ) -> subprocess.Popen:
        data_dir = data_dir or self.data_dir
        env = {**os.environ, "PYTHONPATH": str(ROOT), "INSPECTOR_DATA_DIR": str(data_dir)}
        env.update(INSPECTOR_EMBEDDED_WORKER="false", INSPECTOR_LOG_FORMAT="json")
        env.update(INSPECTOR_DEVICE="cpu", INSPECTOR_UPLOAD_RATE_PER_MINUTE="0")
        env.update(**self.env, **extra)
        log = self.data_dir.parent / f"{name}-{len(self.logs)}.log"
        self.logs.append(log)
        with open(log, "wb") as out:  # the child keeps its own descriptor
            return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=out, stderr=out)

    def start_server(self, wait: bool = True) -> None:
        code = "from server.cli_commands import serve; "
        code += f"raise SystemExit(serve('127.0.0.1', {self.port}))"
        self.server = self._spawn(code, "server", **self.server_env)
        if wait:
            self.wait_ready()

    def start_worker(self, data_dir: Path | None = None) -> subprocess.Popen:
        """A worker on the cluster's data dir, or on its own (a host of its own)."""
        code = "from server.cli_commands import worker; raise SystemExit(worker())"
        if data_dir is not None:
            data_dir.mkdir(parents=True, exist_ok=True)
        proc = self._spawn(code, "worker", data_dir)
        self.workers.append(proc)
        return proc

    def wait_ready(self, timeout_s: float = 90) -> None:
        def ready() -> bool:
            assert self.server is not None and self.server.poll() is None, self.tail("server")
            with contextlib.suppress(httpx.TransportError):
                return httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
            return False

        wait_until(ready, timeout_s, "/readyz")

    def kill_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGKILL)
            self.server.wait(30)

    def stop(self) -> None:
        procs = [p for p in [self.server, *self.workers] if p is not None and p.poll() is None]
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def tail(self, prefix: str = "", chars: int = 3000) -> str:
        text = "".join(
            p.read_text(errors="replace") for p in self.logs if p.name.startswith(prefix)
        )
        return text[-chars:]

    def events(self, name: str) -> list[dict]:
        """JSON log records with `event == name`, from every process of this cluster."""
        found = []
        for path in self.logs:
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("{") and f'"{name}"' in line:
                    with contextlib.suppress(json.JSONDecodeError):
                        record = json.loads(line)
                        if record.get("event") == name:
                            found.append(record)
        return found


@contextlib.contextmanager
def cluster(
    data_dir: Path,
    workers: int = 1,
    *,
    own_dirs: bool = False,
    server_env: dict[str, str] | None = None,
    **env: str,
) -> Iterator[Cluster]:
    """A server and `workers` workers; with `own_dirs` each worker has a data dir of its own
    (`<data_dir>-worker-<i>`), as on other hosts: they share only the database and queue."""
    data_dir.mkdir(parents=True, exist_ok=True)
    c = Cluster(data_dir, env, server_env=dict(server_env or {}))
    try:
        c.start_server()
        for i in range(workers):
            c.start_worker(worker_dir(data_dir, i) if own_dirs else None)
        yield c
    finally:
        c.stop()


def worker_dir(data_dir: Path, i: int) -> Path:
    """The data dir of worker `i` in a cluster with `own_dirs`."""
    return data_dir.with_name(f"{data_dir.name}-worker-{i}")


# --- a private Redis ---------------------------------------------------------------------------


@dataclass
class PrivateRedis:
    """`redis-server` on a free loopback port, without persistence: ours to stop and start."""

    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed"
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: _port_open(self.port), 20, "redis-server to listen")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    redis = PrivateRedis()
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()


# --- a TCP proxy we can cut -------------------------------------------------------------------


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; `stop()` refuses new connections and cuts open
    ones (what a database restart looks like to its clients), `start()` serves again."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by stop()
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def stop(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):  # wakes the thread blocked in accept()
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
