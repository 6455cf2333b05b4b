"""The worker's handle on one zygote: a bwrap sandbox that has imported torch and the
pipeline and forks one self-confining child per job (inspector/zygote).

`Zygote.start` spawns it (it gets ready on its own, while the worker idles); `wait_ready`
takes its first message; `server.sandbox.forked.run_forked` runs a job through it.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inspector.beside import MEMORY_ENV
from inspector.zygote import wire
from server.sandbox.bwrap import child_env, inspector_root, zygote_bwrap_argv
from server.sandbox.limits import Limits, priority_prefix
from server.sandbox.output import CappedStream
from server.sandbox.procs import kill_tree, ns_pids, tree_pids
from server.sandbox.seccomp import seccomp_fd
from server.sandbox.threads import job_threads

__all__ = ["Zygote", "ZygoteError"]

STDERR_KEEP_BYTES = 16 * 1024


class ZygoteError(RuntimeError):
    """The zygote cannot serve (did not get ready, died, answered nonsense)."""


@dataclass(eq=False)
class Zygote:
    jobs_root: Path
    gpu: bool
    proc: subprocess.Popen
    sock: socket.socket
    stderr: CappedStream
    started: float = field(default_factory=time.monotonic)
    info: dict[str, Any] | None = None  # its "ready" message: import_s, warmup_s, modules
    jobs_run: int = 0
    broken: bool = False

    @classmethod
    def start(cls, jobs_root: Path, limits: Limits, *, gpu: bool = False) -> Zygote:
        """Spawn it; it imports and warms up on its own (see `wait_ready`)."""
        jobs_root.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        setup_fd, job_fd = seccomp_fd(zygote=True), seccomp_fd()
        try:
            env = child_env(inspector_root(), threads=job_threads(limits.threads, gpu=gpu))
            env["OPENBLAS_NUM_THREADS"] = "1"  # numpy's BLAS pool would be a thread at fork
            env[MEMORY_ENV] = str(limits.memory_bytes)  # what runs beside the passes fits in it
            command = [sys.executable, "-m", "inspector.zygote", str(theirs.fileno()), str(job_fd)]
            inner = zygote_bwrap_argv(
                jobs_root, command, env=env, seccomp_fd=setup_fd, tmp_bytes=limits.tmp_bytes,
                gpu=gpu,
            )  # fmt: skip
            # Its children inherit its priority; each sets its own rlimits (inspector.zygote).
            proc = subprocess.Popen(
                [*priority_prefix(limits), *inner], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                pass_fds=(theirs.fileno(), setup_fd, job_fd), env={"PATH": "/usr/bin:/bin"},
            )  # fmt: skip
        finally:
            for fd in (theirs.detach(), setup_fd, job_fd):
                os.close(fd)
        stderr = CappedStream(proc.stderr, STDERR_KEEP_BYTES)
        return cls(jobs_root, gpu, proc, ours, stderr)

    def message(self, timeout_s: float) -> dict[str, Any] | None:
        """Its next message, or None when none came within `timeout_s`."""
        if not select.select([self.sock], [], [], max(timeout_s, 0))[0]:
            return None
        try:
            message, _ = wire.recv(self.sock)
        except (OSError, ValueError) as exc:
            raise self._fail(f"unreadable message: {exc}") from exc
        if message is None:
            raise self._fail("it ended")
        return message

    def send(self, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        try:
            wire.send(self.sock, message, fds)
        except OSError as exc:
            raise self._fail(f"cannot write to it: {exc}") from exc

    def wait_ready(
        self,
        timeout_s: float,
        should_stop: Callable[[], bool] | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Its "ready" message (raises ZygoteError when it fails, is late or we stop);
        `on_tick` runs meanwhile (the job's heartbeat: a waiting job is not a lost one)."""
        deadline = time.monotonic() + timeout_s
        while self.info is None:
            if should_stop is not None and should_stop():
                raise ZygoteError("the worker is stopping")
            if on_tick is not None:
                on_tick()
            message = self.message(min(0.25, deadline - time.monotonic()))
            if message is not None and message.get("ready") is not True:
                raise self._fail(f"not ready: {message.get('error')}")
            if message is not None:
                self.info = message
            elif time.monotonic() >= deadline:
                raise self._fail(f"not ready after {timeout_s:g} s")
        return self.info

    def host_pid(self, pid: int) -> int | None:
        """Our pid of the process that is `pid` in the zygote's pid namespace."""
        for candidate in tree_pids(self.proc.pid):
            numbers = ns_pids(candidate)
            if len(numbers) == 2 and numbers[1] == pid:
                return candidate
        return None

    def _fail(self, why: str) -> ZygoteError:
        self.broken = True
        tail = self.stderr.text().strip()[-2000:]
        return ZygoteError(f"the zygote failed: {why}" + (f"\n{tail}" if tail else ""))

    @property
    def alive(self) -> bool:
        return not self.broken and self.proc.poll() is None

    def close(self) -> None:
        """End it and everything it forked (a job still running is killed with it)."""
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.stderr.join(2)
