"""The bubblewrap command line: a read-only runtime, the job dir as the only writable path.

Inside: the Python runtime and the `inspector` package read-only at their host paths (so
the venv's own paths keep working), /usr and the /lib* links, a fresh /proc and /dev, a
size-capped tmpfs /tmp, the job dir at /job (its inputs re-bound read-only), no network,
no capabilities, uid/gid 65534, no further user namespaces, and the seccomp filter.
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

__all__ = [
    "BWRAP", "JOB_MOUNT", "JOBS_MOUNT", "HOST_PROC", "bwrap_argv", "zygote_bwrap_argv",
    "runtime_paths", "inspector_root", "child_env",
]  # fmt: skip

BWRAP = "/usr/bin/bwrap"
JOB_MOUNT = "/job"
JOBS_MOUNT = "/jobs"  # the zygote's view of every job dir (inspector.zygote.confine)
HOST_PROC = "/run/hostproc"
SANDBOX_UID = 65534
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")


@lru_cache(maxsize=1)
def inspector_root() -> str:
    """The folder holding the `inspector` package (found without importing it: no torch)."""
    import importlib.util

    spec = importlib.util.find_spec("inspector")
    assert spec is not None and spec.origin is not None, "the inspector package is not importable"
    return str(Path(spec.origin).resolve().parent.parent)


def runtime_paths() -> list[str]:
    """Host folders the child needs read-only: the Python install, the venv, inspector."""
    candidates = {
        sys.prefix,
        sys.base_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        os.path.join(inspector_root(), "inspector"),
    }
    paths = sorted(os.path.realpath(p) for p in candidates)
    # Drop what /usr already covers and paths nested in another kept path.
    kept: list[str] = []
    for path in paths:
        if path.startswith("/usr/") or any(path.startswith(k + "/") for k in kept):
            continue
        kept.append(path)
    return kept


def _root_links() -> list[str]:
    """/lib, /lib64, /bin, /sbin: symlinks into /usr on merged-/usr systems, else binds."""
    args: list[str] = []
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    return args


def _gpu_args() -> list[str]:
    args: list[str] = []
    for dev in sorted(glob.glob("/dev/nvidia*")):
        args += ["--dev-bind", dev, dev]
    if args:  # the CUDA driver reads its topology from /sys
        args += ["--ro-bind", "/sys", "/sys"]
    return args


def child_env(pythonpath: str, threads: int) -> dict[str, str]:
    """Everything the child sees of an environment: no secrets, no database or queue URLs."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "USER": "nobody",
        "LOGNAME": "nobody",
        "LANG": "C.UTF-8",
        "PYTHONPATH": pythonpath,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONNOUSERSITE": "1",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        # Idle OpenMP threads sleep instead of spinning: on a shared host (and job children
        # run niced) a spinning team waits for a descheduled thread at every parallel op;
        # a 3-layer MLP's report took 3.7 s spinning and 2.4 s passive on two busy cores.
        "OMP_WAIT_POLICY": "PASSIVE",
        "MALLOC_ARENA_MAX": "2",  # each glibc arena reserves 64 MiB of address space
        "TMPDIR": "/tmp",
        "XDG_CACHE_HOME": "/tmp/.cache",
        "MPLCONFIGDIR": "/tmp/.mpl",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    return env


def _refuse_inside_runtime(path: Path) -> None:
    real = os.path.realpath(path)
    if any(real == p or real.startswith(p + "/") for p in ["/usr", *runtime_paths()]):
        # Its siblings (other jobs, the database) would be readable through the runtime bind.
        raise ValueError(f"the data dir must not lie inside the runtime ({real})")


def _common_args(tmp_bytes: int) -> list[str]:
    """Namespaces, a private /tmp and /dev/shm, /proc, /dev, and the read-only runtime."""
    args = [BWRAP, "--unshare-all", "--unshare-user", "--disable-userns"]
    args += ["--die-with-parent", "--new-session", "--clearenv"]
    args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox"]
    # The private /tmp first: a runtime that lives under /tmp (a checkout there, its venv)
    # is bound on top of it, not hidden by it.
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    args += ["--size", str(tmp_bytes), "--tmpfs", "/dev/shm"]
    args += ["--ro-bind", "/usr", "/usr", *_root_links()]
    for path in ETC_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for path in runtime_paths():
        args += ["--ro-bind", path, path]
    return args


def _tail(env: dict[str, str], gpu: bool, chdir: str, seccomp_fd: int, command: list[str]):  # noqa: ANN202
    args = _gpu_args() if gpu else []
    for key, value in env.items():
        args += ["--setenv", key, value]
    # The sandbox's own root is a tmpfs (RAM) holding the mount points: keep it read-only.
    args += ["--remount-ro", "/", "--chdir", chdir]
    return [*args, "--seccomp", str(seccomp_fd), "--", *command]


def bwrap_argv(
    job_dir: Path,
    command: list[str],
    *,
    env: dict[str, str],
    seccomp_fd: int,
    readonly: Iterable[str] = (),
    tmp_bytes: int,
    gpu: bool = False,
) -> list[str]:
    """`bwrap ... -- command`; `readonly` are paths inside the job dir re-bound read-only."""
    _refuse_inside_runtime(job_dir)
    args = [*_common_args(tmp_bytes), "--cap-drop", "ALL"]
    args += ["--bind", str(job_dir), JOB_MOUNT]
    for rel in readonly:
        args += ["--ro-bind", str(job_dir / rel), f"{JOB_MOUNT}/{rel}"]
    return args + _tail(env, gpu, JOB_MOUNT, seccomp_fd, command)


def zygote_bwrap_argv(
    jobs_root: Path, command: list[str], *, env: dict[str, str], seccomp_fd: int,
    tmp_bytes: int, gpu: bool = False,
) -> list[str]:  # fmt: skip
    """The zygote's sandbox: as a job's, but it keeps its capabilities inside its own user
    namespace (to set its children up), sees every job dir at /jobs and the host's /proc at
    /run/hostproc (the kernel mounts a child's /proc only while one is fully visible); its
    children hide both before they read an upload."""
    _refuse_inside_runtime(jobs_root)
    args = [*_common_args(tmp_bytes), "--cap-drop", "ALL", "--cap-add", "ALL"]
    args += ["--bind", str(jobs_root), JOBS_MOUNT, "--dir", JOB_MOUNT]
    args += ["--bind", "/proc", HOST_PROC]
    return args + _tail(env, gpu, "/", seccomp_fd, command)
