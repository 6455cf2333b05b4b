"""Run one child confined, watch it from outside, and name how it ended.

The parent-side watchdog polls the child's whole process tree (it may leave its session,
but not the sandbox's pid namespace): wall clock, resident memory, process count and what
it wrote to its job dir. Any breach ends the tree with SIGKILL. RLIMIT_AS makes most
runaway allocations fail inside the child first; the watchdog catches the rest.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from inspector.beside import MEMORY_ENV
from server.sandbox.bwrap import JOB_MOUNT, bwrap_argv, child_env, inspector_root
from server.sandbox.cgroup import JobCgroup
from server.sandbox.limits import Limits, oom_first_prefix, priority_prefix, prlimit_prefix
from server.sandbox.output import CappedStream
from server.sandbox.procs import kill_tree, tree_memory, tree_pids, tree_resident_bound
from server.sandbox.seccomp import seccomp_fd
from server.sandbox.threads import job_threads

__all__ = ["Outcome", "run_child", "job_python_command"]

log = logging.getLogger(__name__)
SANDBOX_OVERHEAD_PROCS = 2  # the outer bwrap and the pid namespace's init
DISK_CHECK_EVERY_S = 1.0
MEMORY_READ_EVERY = 20  # a read of the tree's memory costs at most 1/20 of a core
CGROUP_MEMORY_MARGIN_BYTES = 256 * 1024**2


@dataclass
class Outcome:
    status: str  # done, failed, timed_out, out_of_memory, killed (or interrupted: we stopped it)
    reason: str
    exit_code: int | None = None
    signal: str | None = None  # e.g. "SIGSEGV" when a signal ended the child
    started_at: float = 0.0  # time.time() when the sandbox was spawned
    duration_s: float = 0.0
    peak_rss_bytes: int = 0
    peak_procs: int = 0
    stdout: str = ""
    stderr: str = ""
    output_bytes: int = 0  # stdout + stderr produced, kept or not


@dataclass
class Watch:
    limits: Limits
    job_dir: Path
    start: float
    base_disk: tuple[int, int]
    peak_rss: int = 0
    peak_procs: int = 0
    next_disk_check: float = 0.0
    next_memory_read: float = 0.0  # the proportional set size's next read (`_memory_over`)
    should_stop: Callable[[], bool] | None = None
    overhead_procs: int = SANDBOX_OVERHEAD_PROCS  # processes of ours in the watched tree

    def breach(self, pid: int) -> tuple[str, str] | None:
        """(status, reason) when the child went past a limit, else None."""
        pids = tree_pids(pid)
        procs = max(len(pids) - self.overhead_procs, 0)
        self.peak_procs = max(self.peak_procs, procs)
        lim, now = self.limits, time.monotonic()
        if self.should_stop is not None and self.should_stop():
            return "interrupted", "the worker is stopping"
        if now - self.start > lim.wall_s:
            return "timed_out", f"ran longer than the job time limit of {lim.wall_s:g} s"
        # Counted before any memory is read: a fork bomb also grows in memory, and reading
        # the memory of thousands of processes would let it grow faster than we look.
        if procs > lim.max_procs:
            return "killed", f"started more than {lim.max_procs} processes"
        if self._memory_over(pids, now):
            return "out_of_memory", f"used more than the memory limit of {_gib(lim.memory_bytes)}"
        if now >= self.next_disk_check:
            self.next_disk_check = now + DISK_CHECK_EVERY_S
            return self._disk_breach()
        return None

    def _memory_over(self, pids: list[int], now: float) -> bool:
        """Whether the tree's proportional set size is past the limit. Reading it walks
        every mapping of every process, under each one's memory lock: a 1 GB job and five
        forks of it took 120 ms a read, half a core at one read a poll, taken from the job
        it watches. So it is read where the resident sizes summed (kernel counters; never
        below it) pass the limit, and else at most once in MEMORY_READ_EVERY times what
        the last read took: no breach is missed, and the peak is sampled less often."""
        if tree_resident_bound(pids) <= self.limits.memory_bytes and now < self.next_memory_read:
            return False
        began = time.monotonic()
        used = tree_memory(pids)
        took = time.monotonic() - began
        self.next_memory_read = now + max(self.limits.poll_s, MEMORY_READ_EVERY * took)
        self.peak_rss = max(self.peak_rss, used)
        return used > self.limits.memory_bytes

    def _disk_breach(self) -> tuple[str, str] | None:
        used, files = disk_usage(self.job_dir, self.limits.max_job_files * 2)
        if used - self.base_disk[0] > self.limits.max_file_bytes:
            return "killed", f"wrote more than {_gib(self.limits.max_file_bytes)} to its job folder"
        if files - self.base_disk[1] > self.limits.max_job_files:
            return "killed", f"created more than {self.limits.max_job_files} files"
        return None


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.0f} MiB"


def disk_usage(root: Path, max_files: int) -> tuple[int, int]:
    """(bytes allocated, file count) under `root`, not following links; stops counting
    past `max_files` entries."""
    used, files, todo = 0, 0, [str(root)]
    while todo and files <= max_files:
        with contextlib.suppress(OSError), os.scandir(todo.pop()) as entries:
            for entry in entries:
                files += 1
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    used += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
    return used, files


def job_python_command(module: str = "inspector.job") -> list[str]:
    """`python -m inspector.job /job`: the interpreter the worker itself runs on."""
    return [sys.executable, "-m", module, JOB_MOUNT]


def _spawn_argv(argv, job_dir, limits, confined, readonly, gpu, fd, cgroup) -> list[str]:  # noqa: ANN001
    env = child_env(inspector_root(), threads=job_threads(limits.threads, gpu=gpu))
    env[MEMORY_ENV] = str(limits.memory_bytes)  # what runs beside the passes fits in it
    if confined:
        inner = bwrap_argv(
            job_dir, argv, env=env, seccomp_fd=fd, readonly=readonly,
            tmp_bytes=limits.tmp_bytes, gpu=gpu,
        )  # fmt: skip
    else:  # trusted-only mode: rlimits and the watchdog, but no namespaces
        real = [str(job_dir) if a == JOB_MOUNT else a for a in argv]
        inner = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()), *real]
    full = [*oom_first_prefix(), *priority_prefix(limits), *prlimit_prefix(limits), *inner]
    if cgroup is not None:  # join the cgroup first, so every later fork is counted in it
        script = 'for f in "$@"; do case $f in --) break;; esac; echo $$ > "$f"; done; '
        script += 'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"'
        full = ["/bin/sh", "-c", script, "sh", *cgroup.procs_files, "--", *full]
    return full


def run_child(
    argv: list[str],
    job_dir: Path,
    limits: Limits,
    *,
    confined: bool = True,
    readonly: Iterable[str] = (),
    gpu: bool = False,
    on_tick: Callable[[], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Outcome:
    """Run `argv` with `job_dir` at /job (the literal argument "/job" is replaced by the real
    path when not `confined`) and return how it ended. `on_tick` runs every poll; when
    `should_stop()` turns true the child is ended with status `interrupted`."""
    fd = seccomp_fd() if confined else -1
    cgroup = JobCgroup.create(limits.max_procs + 8, cgroup_memory(limits))
    try:
        full = _spawn_argv(argv, job_dir, limits, confined, tuple(readonly), gpu, fd, cgroup)
        base = disk_usage(job_dir, limits.max_job_files)
        watch = Watch(limits, job_dir, time.monotonic(), base, should_stop=should_stop)
        return _supervise(full, watch, fd, cgroup, on_tick)
    finally:
        if fd >= 0:
            os.close(fd)
        if cgroup is not None:
            cgroup.remove()


def cgroup_memory(limits: Limits) -> int:
    # The watchdog acts at memory_bytes; the cgroup is the hard ceiling just above it,
    # and also counts the tmpfs pages of /tmp and /dev/shm.
    return limits.memory_bytes + 2 * limits.tmp_bytes + CGROUP_MEMORY_MARGIN_BYTES


def _supervise(full, watch: Watch, fd, cgroup, on_tick) -> Outcome:  # noqa: ANN001
    limits, job_dir = watch.limits, watch.job_dir
    started_at, start = time.time(), time.monotonic()
    watch.start = start
    proc = subprocess.Popen(
        full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        pass_fds=(fd,) if fd >= 0 else (), start_new_session=True, cwd=job_dir,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    out = CappedStream(proc.stdout, limits.output_bytes)
    err = CappedStream(proc.stderr, limits.output_bytes)
    breach = _watch_loop(proc, watch, on_tick)
    if breach is not None:  # not reaped yet: its pid and group are still ours
        kill_tree(proc.pid)
    if cgroup is not None:  # stragglers of an unconfined child
        cgroup.kill()
    rc = proc.wait()
    out.join(5)
    err.join(5)
    outcome = name_ending(rc, breach, cgroup, limits)
    outcome.started_at, outcome.duration_s = started_at, time.monotonic() - start
    outcome.peak_rss_bytes, outcome.peak_procs = watch.peak_rss, watch.peak_procs
    outcome.stdout, outcome.stderr = out.text(), err.text()
    outcome.output_bytes = out.total_bytes + err.total_bytes
    return outcome


def _watch_loop(proc: subprocess.Popen, watch: Watch, on_tick) -> tuple[str, str] | None:  # noqa: ANN001
    while True:
        try:
            proc.wait(timeout=watch.limits.poll_s)
            return None
        except subprocess.TimeoutExpired:
            pass
        breach = watch.breach(proc.pid)
        if breach is not None:
            return breach
        if on_tick is not None:
            try:
                on_tick()
            except Exception:  # a failed heartbeat must not leave the child unwatched
                log.exception("sandbox on_tick failed")


def name_ending(rc: int, breach, cgroup, limits: Limits) -> Outcome:  # noqa: ANN001
    if breach is not None:
        return Outcome(breach[0], breach[1], exit_code=rc)
    if cgroup is not None and cgroup.oom_killed():
        if cgroup.refused_forks():  # a fork bomb at the process limit, then out of memory
            reason = (
                f"started more than {limits.max_procs} processes (the process limit refused "
                "its forks, then it ran out of memory)"
            )
            return Outcome("killed", reason, exit_code=rc, signal="SIGKILL")
        reason = f"the kernel ended it at the memory limit of {_gib(limits.memory_bytes)}"
        return Outcome("out_of_memory", reason, exit_code=rc, signal="SIGKILL")
    if rc == 0:
        return Outcome("done", "finished", exit_code=0)
    signum = -rc if rc < 0 else rc - 128 if 128 < rc < 128 + signal.NSIG else None
    if signum is None:
        return Outcome("failed", f"exited with status {rc}", exit_code=rc)
    name = _signal_name(signum)
    if signum == signal.SIGXCPU:
        reason = f"used more than the job CPU limit of {limits.cpu_s} s"
        return Outcome("timed_out", reason, exit_code=rc, signal=name)
    return Outcome("killed", f"ended by signal {name}", exit_code=rc, signal=name)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
