"""Run one job as a child forked by a zygote, watched like a fresh child (runner.py).

The same watchdog over the job's whole process tree (wall clock, memory, processes, job
dir), the same optional cgroup, the same named endings. The child waits for our "go"
until we watch it (and it is in its cgroup), so nothing of the upload runs unwatched.
A `ZygoteError` before "go" means the job has not started: run it as a fresh child.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from server.sandbox.cgroup import JobCgroup
from server.sandbox.limits import Limits, rlimit_values
from server.sandbox.output import CappedStream
from server.sandbox.procs import kill_tree
from server.sandbox.runner import Outcome, Watch, cgroup_memory, disk_usage, name_ending
from server.sandbox.threads import job_threads
from server.sandbox.zygote import Zygote, ZygoteError

__all__ = ["run_forked"]

log = logging.getLogger(__name__)
ANSWER_TIMEOUT_S = 10.0  # the zygote answers a request or a kill within this
FORK_OVERHEAD_PROCS = 2  # ours: the job's outer process and its pid namespace's init


def run_forked(
    zygote: Zygote,
    job_dir: Path,
    limits: Limits,
    *,
    readonly: Iterable[str] = (),
    on_tick: Callable[[], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Outcome:
    """Run `inspector.job` on `job_dir` (inside `zygote.jobs_root`) and name how it ended."""
    if job_dir.parent.resolve() != zygote.jobs_root.resolve():
        raise ZygoteError(f"{job_dir} is not in the zygote's jobs folder")
    cgroup = JobCgroup.create(limits.max_procs + 8, cgroup_memory(limits))
    try:
        return _run(zygote, job_dir, limits, tuple(readonly), on_tick, should_stop, cgroup)
    finally:
        if cgroup is not None:
            cgroup.remove()


def _request(job_dir: Path, limits: Limits, readonly: tuple[str, ...], gpu: bool) -> dict:
    rlimits = {name: list(pair) for name, pair in rlimit_values(limits).items()}
    return {
        "job": job_dir.name, "readonly": list(readonly), "tmp_bytes": limits.tmp_bytes,
        "rlimits": rlimits, "threads": job_threads(limits.threads, gpu=gpu),
    }  # fmt: skip


def _run(zygote, job_dir, limits, readonly, on_tick, should_stop, cgroup) -> Outcome:  # noqa: ANN001
    base = disk_usage(job_dir, limits.max_job_files)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    started_at, start = time.time(), time.monotonic()
    try:
        zygote.send(_request(job_dir, limits, readonly, zygote.gpu), (out_write, err_write))
    except ZygoteError:
        os.close(out_read)
        os.close(err_read)
        raise
    finally:
        os.close(out_write)
        os.close(err_write)
    out = CappedStream(os.fdopen(out_read, "rb"), limits.output_bytes)
    err = CappedStream(os.fdopen(err_read, "rb"), limits.output_bytes)
    host = _started(zygote, cgroup)
    watch = Watch(limits, job_dir, start, base, should_stop=should_stop)
    watch.overhead_procs = FORK_OVERHEAD_PROCS
    breach, rc = _watch_loop(zygote, host, watch, on_tick)
    if breach is not None or rc is None:
        rc = _end(zygote, host, cgroup)
    out.join(5)
    err.join(5)
    if breach is None and rc is None:
        breach = ("killed", "lost its sandbox: the zygote ended during the job")
    outcome = name_ending(rc if rc is not None else -9, breach, cgroup, limits)
    outcome.started_at, outcome.duration_s = started_at, time.monotonic() - start
    outcome.peak_rss_bytes, outcome.peak_procs = watch.peak_rss, watch.peak_procs
    outcome.stdout, outcome.stderr = out.text(), err.text()
    outcome.output_bytes = out.total_bytes + err.total_bytes
    return outcome


def _started(zygote: Zygote, cgroup: JobCgroup | None) -> int:
    """Our pid of the job's outer process, once it is in its cgroup and told to go."""
    reply = zygote.message(ANSWER_TIMEOUT_S)
    if reply is None or not isinstance(reply.get("pid"), int):
        zygote.broken = True
        raise ZygoteError(f"the zygote did not start the job: {reply}")
    host = zygote.host_pid(reply["pid"])
    if host is None:  # we could not watch it: it must not start (it ends before confining)
        zygote.send({"go": False})
        zygote.message(ANSWER_TIMEOUT_S)
        zygote.broken = True
        raise ZygoteError(f"the zygote's child {reply['pid']} is not in its process tree")
    if cgroup is not None:
        cgroup.enter_tree(host)
    zygote.send({"go": True})
    return host


def _watch_loop(zygote: Zygote, host: int, watch: Watch, on_tick) -> tuple:  # noqa: ANN001
    """(breach, None) when a limit was passed, (None, exit code) when it ended by itself,
    (None, None) when the zygote went away."""
    while True:
        try:
            message = zygote.message(watch.limits.poll_s)
        except ZygoteError:
            return None, None
        if message is not None:
            return None, int(message.get("exit", -9))
        breach = watch.breach(host)
        if breach is not None:
            return breach, None
        if on_tick is not None:
            try:
                on_tick()
            except Exception:  # a failed heartbeat must not leave the child unwatched
                log.exception("sandbox on_tick failed")


def _end(zygote: Zygote, host: int, cgroup: JobCgroup | None) -> int | None:
    """Kill the job's tree; its exit code as the zygote saw it (None: no answer)."""
    kill_tree(host)
    if cgroup is not None:
        cgroup.kill()
    try:
        message = zygote.message(ANSWER_TIMEOUT_S)
    except ZygoteError:
        return None
    if message is None:
        zygote.broken = True
        return None
    return int(message.get("exit", -9))
