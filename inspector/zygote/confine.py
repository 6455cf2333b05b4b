"""Confine a forked job child as bubblewrap confines a fresh one, with plain syscalls.

The zygote runs in a bwrap sandbox that keeps its capabilities (inside its own user
namespace only), so its forked child can make its own namespaces and mounts: a new pid,
mount, network, IPC and UTS namespace; a fresh /proc, /tmp and /dev/shm; its own job dir
at /job (inputs read-only) and every other job dir hidden. Then it gives everything up:
rlimits, no capabilities (bounding set too), no_new_privs, and the job's seccomp filter,
which refuses unshare and mount, so none of this can be undone by the code that follows.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
from collections.abc import Iterable

__all__ = [
    "JOBS_MOUNT", "HOST_PROC", "unshare_job_namespaces", "set_up_mounts", "apply_rlimits",
    "drop_privileges", "load_seccomp", "die_with_parent", "undumpable",
]  # fmt: skip

JOBS_MOUNT = "/jobs"  # every job dir of the worker, seen only by the zygote
HOST_PROC = "/run/hostproc"  # lets the child mount a proc (the kernel wants one fully visible)
JOB_MOUNT = "/job"

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
# statvfs f_flag bits -> the mount flags a remount must keep (the kernel locks them).
_ST_TO_MS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME,
             2048: MS_NODIRATIME, 4096: MS_RELATIME}  # fmt: skip
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_CAPBSET_DROP = 1, 4, 22, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
SECCOMP_MODE_FILTER = 2
CAP_VERSION_3 = 0x20080522
PROC_COVERS = ("sys", "sysrq-trigger", "irq", "bus")  # read-only, as bwrap's --proc

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg: int = 0) -> int:
    ul = ctypes.c_ulong
    return _libc.prctl(ctypes.c_int(option), ul(arg), ul(0), ul(0), ul(0))


def die_with_parent() -> None:
    """SIGKILL when the parent goes (the zygote, or the job's outer process)."""
    _check(_prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "PR_SET_PDEATHSIG")


def first_to_go_when_memory_runs_out(score: int = 1000) -> None:
    """The kernel's OOM killer picks this process tree first (server.sandbox.limits'
    OOM_SCORE_ADJ): the job, never the worker. Best effort: /proc may be read-only."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(score))


def undumpable() -> None:
    """Its /proc entries (memory, fds) closed to processes of the same uid: the job's."""
    _check(_prctl(PR_SET_DUMPABLE, 0), "PR_SET_DUMPABLE")


def unshare_job_namespaces() -> None:
    """New mount, pid (for the next fork), network, IPC and UTS namespaces."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731 - local shorthand
    result = _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(result, f"mount {target}")


def _bind(source: str, target: str, *, readonly: bool) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    _remount(target, readonly=readonly)


def _remount(target: str, *, readonly: bool) -> None:
    """Change this mount's own flags only, keeping those the kernel locked."""
    kept = os.statvfs(target).f_flag
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV
    flags |= sum(ms for st, ms in _ST_TO_MS.items() if kept & st)
    _mount(None, target, None, flags | (MS_RDONLY if readonly else 0))


def _tmpfs(target: str, size_bytes: int, *, readonly: bool = False) -> None:
    flags = MS_NOSUID | MS_NODEV | (MS_RDONLY | MS_NOEXEC if readonly else 0)
    _mount("tmpfs", target, "tmpfs", flags, f"size={size_bytes},mode=0755")


def set_up_mounts(job_name: str, readonly: Iterable[str], tmp_bytes: int) -> None:
    """Run in the job's pid-namespace init, before anything else."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the zygote
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this job's pids only
    for name in PROC_COVERS:
        if os.path.exists(f"/proc/{name}"):
            _bind(f"/proc/{name}", f"/proc/{name}", readonly=True)
    _private_tmp(tmp_bytes)
    # /dev is the zygote's, shared by every job it forks: read-only, so none leaves a file
    # there for the next (its nodes still work; /dev/shm is the job's own).
    _remount("/dev", readonly=True)
    _tmpfs("/dev/shm", tmp_bytes)
    source = f"{JOBS_MOUNT}/{job_name}"
    _bind(source, JOB_MOUNT, readonly=False)
    for rel in readonly:
        _bind(f"{source}/{rel}", f"{JOB_MOUNT}/{rel}", readonly=True)
    _tmpfs(JOBS_MOUNT, 4096, readonly=True)  # the other jobs' dirs: gone
    _tmpfs(HOST_PROC, 4096, readonly=True)


def _mounts_under(prefix: str) -> list[str]:
    """The outermost mount points below `prefix` in this mount namespace (a recursive bind
    of one brings the mounts inside it along)."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    points = [p.encode().decode("unicode_escape") for p in points if p.startswith(prefix + "/")]
    return [p for p in points if not any(p.startswith(q + "/") for q in points if q != p)]


def _private_tmp(tmp_bytes: int) -> None:
    """A fresh /tmp that keeps the runtime bwrap bound under /tmp (a checkout or a venv
    there: modules imported lazily must still be found), as a fresh child's /tmp does.
    Built on HOST_PROC's mount point, which is covered at the end anyway, then moved."""
    kept = _mounts_under("/tmp")
    if not kept:
        _tmpfs("/tmp", tmp_bytes)
        return
    _tmpfs(HOST_PROC, tmp_bytes)
    for point in kept:
        inside = HOST_PROC + point[len("/tmp") :]
        if os.path.isdir(point):
            os.makedirs(inside, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(inside), exist_ok=True)
            open(inside, "a").close()
        _bind(point, inside, readonly=True)
    _mount(HOST_PROC, "/tmp", None, MS_MOVE)


def apply_rlimits(limits: dict[str, list[int]]) -> None:
    """{"RLIMIT_CPU": [soft, hard], ...}: only ever lowered (no capability needed)."""
    for name, (soft, hard) in limits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]  # fmt: skip


def drop_privileges() -> None:
    """No capability left, none to gain back by exec (empty bounding set, no_new_privs)."""
    for cap in range(64):
        if _prctl(PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            _check(-1, f"PR_CAPBSET_DROP {cap}")
    _check(_prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL), "PR_CAP_AMBIENT_CLEAR_ALL")
    header, data = _CapHeader(CAP_VERSION_3, 0), (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "PR_SET_NO_NEW_PRIVS")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(bpf: bytes) -> None:
    """Install the job's compiled filter (libseccomp's BPF, 8 bytes an instruction)."""
    program = ctypes.create_string_buffer(bpf, len(bpf))
    fprog = _SockFprog(len(bpf) // 8, ctypes.addressof(program))
    pointer = ctypes.cast(ctypes.pointer(fprog), ctypes.c_void_p).value or 0
    ul = ctypes.c_ulong
    result = _libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ul(SECCOMP_MODE_FILTER), ul(pointer), ul(0))
    _check(result, "seccomp")
