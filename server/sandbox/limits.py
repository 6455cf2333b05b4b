"""What one job child may use, and the command prefix that sets its CPU priority (`chrt`,
`nice`) and the kernel's rlimits (`prlimit`).

Each tool sets its part and execs the next, down to bwrap (the sandbox inherits it all), so
the worker never forks with a `preexec_fn` while it runs threads, and the worker itself
(its watchdog and heartbeat threads) keeps its own priority. The child cannot raise its
priority again: that needs CAP_SYS_NICE, which the sandbox drops.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Limits", "priority_prefix", "prlimit_prefix", "address_space_bytes", "rlimit_values",
    "OOM_SCORE_ADJ", "oom_first_prefix",
]  # fmt: skip

MiB = 1024**2
GiB = 1024**3
# `import torch` maps ~0.7-1.5 GB it never touches; RLIMIT_AS counts it all.
MIN_ADDRESS_SPACE_BYTES = 3 * GiB
ADDRESS_SPACE_HEADROOM_BYTES = 1 * GiB


@dataclass(frozen=True)
class Limits:
    wall_s: float = 600.0
    memory_bytes: int = 8 * GiB  # resident set of the whole tree (watchdog) and RLIMIT_AS base
    cpu_s: int = 1200
    max_procs: int = 256
    max_file_bytes: int = 1 * GiB  # RLIMIT_FSIZE, and what the child may add to its job dir
    max_open_files: int = 1024
    tmp_bytes: int = 256 * MiB  # the sandbox's /tmp (a tmpfs: RAM)
    output_bytes: int = 256 * 1024  # stdout and stderr kept, each
    max_job_files: int = 10_000  # files the child may create in its job dir
    address_space: bool = True  # RLIMIT_AS; off for CUDA, whose driver maps huge ranges
    nice: int = 10  # added to the worker's CPU niceness: web requests on the host go first
    sched_idle: bool = False  # SCHED_IDLE: the CPU only when nothing else on the host wants it
    poll_s: float = 0.1
    threads: int | None = None  # a job child's intra-op threads; None: by the cores (threads.py)

    @classmethod
    def from_settings(cls, settings: Any, *, cuda: bool = False) -> Limits:
        return cls(
            wall_s=float(settings.job_timeout_s),
            memory_bytes=int(settings.job_memory_bytes),
            cpu_s=int(settings.job_cpu_s),
            max_procs=int(settings.job_max_procs),
            max_file_bytes=int(settings.job_max_file_bytes),
            tmp_bytes=int(getattr(settings, "job_tmp_bytes", cls.tmp_bytes)),
            output_bytes=int(getattr(settings, "job_output_bytes", cls.output_bytes)),
            address_space=not cuda,
            nice=int(getattr(settings, "job_nice", cls.nice)),
            sched_idle=bool(getattr(settings, "job_sched_idle", cls.sched_idle)),
            threads=getattr(settings, "job_threads", None),
        )


def address_space_bytes(limits: Limits) -> int:
    return max(limits.memory_bytes + ADDRESS_SPACE_HEADROOM_BYTES, MIN_ADDRESS_SPACE_BYTES)


# When the machine runs out of memory, the kernel kills the process with the highest
# oom_score: a job child (whose score grows with its memory) is made its first choice, so
# an upload that exhausts memory ends itself, never the worker, the web server or whatever
# else runs beside them. Raising one's own score needs no privilege; lowering it does.
OOM_SCORE_ADJ = 1000


def oom_first_prefix() -> list[str]:
    """`sh -c 'echo 1000 > /proc/self/oom_score_adj; exec "$@"'`: inherited by the tree."""
    script = f'echo {OOM_SCORE_ADJ} > /proc/self/oom_score_adj 2>/dev/null; exec "$@"'
    return ["/bin/sh", "-c", script, "sh"]


def priority_prefix(limits: Limits) -> list[str]:
    """`chrt --idle 0` when asked, then `nice -n N` (unless 0): the child yields the CPU."""
    args: list[str] = []
    if limits.sched_idle:
        args += [shutil.which("chrt") or "/usr/bin/chrt", "--idle", "0"]
    if limits.nice > 0:
        args += [shutil.which("nice") or "/usr/bin/nice", "-n", str(limits.nice)]
    return args


def rlimit_values(limits: Limits) -> dict[str, tuple[int, int]]:
    """The kernel's limits for one job child: {"RLIMIT_CPU": (soft, hard), ...}. The soft
    CPU limit sends SIGXCPU, the hard one SIGKILL 5 s later."""
    values = {
        "RLIMIT_CPU": (limits.cpu_s, limits.cpu_s + 5),
        "RLIMIT_NOFILE": (limits.max_open_files, limits.max_open_files),
        "RLIMIT_FSIZE": (limits.max_file_bytes, limits.max_file_bytes),
        "RLIMIT_CORE": (0, 0),
    }
    if os.geteuid() != 0:
        # RLIMIT_NPROC counts every task of the real uid (the worker's own too) and is
        # not enforced for root at all; the watchdog and the pids cgroup count as well.
        nproc = limits.max_procs + _tasks_of_uid(os.geteuid())
        values["RLIMIT_NPROC"] = (nproc, nproc)
    if limits.address_space:
        values["RLIMIT_AS"] = (address_space_bytes(limits), address_space_bytes(limits))
    return values


_PRLIMIT_FLAGS = {"RLIMIT_CPU": "cpu", "RLIMIT_NOFILE": "nofile", "RLIMIT_FSIZE": "fsize",
                  "RLIMIT_CORE": "core", "RLIMIT_NPROC": "nproc", "RLIMIT_AS": "as"}  # fmt: skip


def prlimit_prefix(limits: Limits) -> list[str]:
    """`prlimit --cpu=S:H ... --` : `rlimit_values` set on the command that follows."""
    prlimit = shutil.which("prlimit") or "/usr/bin/prlimit"
    args = [prlimit]
    for name, (soft, hard) in rlimit_values(limits).items():
        value = f"{soft}:{hard}" if soft != hard else str(soft)
        args.append(f"--{_PRLIMIT_FLAGS[name]}={value}")
    return [*args, "--"]


def _tasks_of_uid(uid: int) -> int:
    """Threads (tasks) that `uid` runs now: what RLIMIT_NPROC compares against."""
    count = 0
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid:
                count += len(os.listdir(f"/proc/{name}/task"))
        except OSError:
            continue
    return count
