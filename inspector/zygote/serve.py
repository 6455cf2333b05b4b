"""The zygote's loop: get ready once, then one forked, self-confining child per request.

Per job (the worker speaks first, `wire` messages):
  worker -> {"job": NAME, "readonly": [...], "tmp_bytes": N, "rlimits": {...}, "threads": N}
            with the write ends of the child's stdout and stderr pipes
  zygote -> {"pid": P}     the job's outer process, in the zygote's pid namespace
  worker -> {"go": true}   once it watches P (and put it in the job's cgroup)
  zygote -> {"exit": RC}   when the job's processes are gone
The outer process only makes the namespaces and waits; its child, the pid-namespace
init, makes the mounts and reaps; the job process under it confines itself and runs
`inspector.job`. Nothing in this process ever runs the
upload's code, so nothing of one job can reach the next.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from inspector.zygote import confine, wire

__all__ = ["main", "EXIT_SETUP_FAILED"]

EXIT_SETUP_FAILED = 125  # the child could not confine itself: nothing of the upload ran
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def _ready(bpf: bytes) -> dict[str, Any]:
    """Import torch and the pipeline, then what a first analysis imports."""
    start = time.perf_counter()
    import inspector.analyze  # noqa: F401 - the point: imported once, here
    import inspector.job  # noqa: F401
    from inspector.zygote.warmup import import_all, learned_imports, warm_caches

    imported = time.perf_counter()
    names = learned_imports(Path("/tmp/inspector-warmup"))
    count = import_all(names)
    warm_caches()
    tasks = len(os.listdir("/proc/self/task"))
    warmed = time.perf_counter()
    info = {"import_s": round(imported - start, 3), "warmup_s": round(warmed - imported, 3)}
    info["modules"] = count
    if tasks != 1 or threading.active_count() != 1:
        # Forking a multi-threaded process can deadlock the child (OpenMP, locks held).
        return {"ready": False, "error": f"the zygote runs {tasks} threads after warming up"}
    if len(bpf) % 8 or not bpf:
        return {"ready": False, "error": "no seccomp filter for the jobs"}
    return {"ready": True, **info}


def _read_fd(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def main(argv: list[str]) -> int:
    """`python -m inspector.zygote SOCKET_FD SECCOMP_FD`."""
    sock = socket.socket(fileno=int(argv[0]))
    bpf = _read_fd(int(argv[1]))
    sys.stdout.flush()
    try:
        status = _ready(bpf)
    except Exception as exc:  # noqa: BLE001 - the worker falls back to fresh children
        status = {"ready": False, "error": f"{type(exc).__name__}: {exc}"}
        traceback.print_exc()
    wire.send(sock, status)
    if not status["ready"]:
        return 1
    while True:
        request, fds = wire.recv(sock, max_fds=2)
        if request is None:  # the worker closed its end: we are done
            return 0
        _serve_one(sock, request, fds, bpf)


def _serve_one(sock: socket.socket, request: dict[str, Any], fds: list[int], bpf: bytes) -> None:
    name = str(request.get("job", ""))
    if len(fds) != 2 or not JOB_NAME.fullmatch(name) or not os.path.isdir(f"/jobs/{name}"):
        for fd in fds:
            os.close(fd)
        wire.send(sock, {"error": f"not a job request: {name!r}"})
        return
    go_read, go_write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _outer(request, fds, go_read, sock, bpf)  # never returns
    for fd in (*fds, go_read):
        os.close(fd)
    wire.send(sock, {"pid": pid})
    reply, _ = wire.recv(sock)
    if reply is not None and reply.get("go") is True:
        os.write(go_write, b"g")
    os.close(go_write)  # no "go": the child reads EOF and ends before confining
    _, status = os.waitpid(pid, 0)
    wire.send(sock, {"exit": os.waitstatus_to_exitcode(status)})


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code  # killed by a signal: 128 + its number


def _outer(
    request: dict[str, Any], fds: list[int], go_read: int, sock: socket.socket, bpf: bytes
) -> None:
    """The job's outer process: new session and namespaces, then wait for its init."""
    code = EXIT_SETUP_FAILED
    try:
        os.setsid()  # the worker ends the job with killpg
        confine.die_with_parent()
        confine.first_to_go_when_memory_runs_out()  # inherited by its init and the job
        sock.detach()
        null = os.open("/dev/null", os.O_RDONLY)
        for target, fd in ((0, null), (1, fds[0]), (2, fds[1])):
            os.dup2(fd, target)
        os.closerange(3, go_read)
        os.closerange(go_read + 1, 1 << 20)  # the worker's socket above all: not the job's
        confine.unshare_job_namespaces()
        pid = os.fork()
        if pid == 0:
            _init(request, go_read, bpf)  # never returns
        os.close(go_read)
        _, status = os.waitpid(pid, 0)
        code = _exit_code(status)
    except BaseException:  # noqa: BLE001 - say why on the job's stderr
        traceback.print_exc()
    finally:
        os._exit(code)


def _init(request: dict[str, Any], go_read: int, bpf: bytes) -> None:
    """Pid 1 of the job's namespace, as bwrap's own init: make the mounts, give up every
    privilege, start the job process and reap until it ends (its namespace then dies).
    The job is not pid 1 itself: the kernel spares pid 1 signals it has no handler for,
    SIGXCPU from RLIMIT_CPU among them."""
    code = EXIT_SETUP_FAILED
    try:
        confine.die_with_parent()
        readonly = [str(r) for r in request.get("readonly", [])]
        confine.set_up_mounts(str(request["job"]), readonly, int(request["tmp_bytes"]))
        pid = os.fork()
        if pid == 0:
            _job(request, go_read, bpf)  # never returns
        os.close(go_read)
        confine.drop_privileges()
        confine.undumpable()
        confine.load_seccomp(bpf)
        while True:  # orphans of the job are ours to reap
            done, status = os.wait()
            if done == pid:
                code = _exit_code(status)
                break
    except BaseException:  # noqa: BLE001 - nothing of the upload has run yet
        traceback.print_exc()
    finally:
        os._exit(code)


def _job(request: dict[str, Any], go_read: int, bpf: bytes) -> None:
    """The job process: wait for the worker's go, confine, run `inspector.job`."""
    try:
        confine.die_with_parent()
        if os.read(go_read, 1) != b"g":
            os._exit(EXIT_SETUP_FAILED)
        os.close(go_read)
        confine.apply_rlimits(request.get("rlimits") or {})
        confine.drop_privileges()
        confine.load_seccomp(bpf)
        os.chdir(confine.JOB_MOUNT)
        _fresh_process_state(int(request.get("threads") or 1))
    except BaseException:  # noqa: BLE001 - nothing of the upload has run yet
        traceback.print_exc()
        os._exit(EXIT_SETUP_FAILED)
    from inspector.job import main as job_main

    code = job_main([confine.JOB_MOUNT])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _fresh_process_state(threads: int) -> None:
    """What a fresh `python -m inspector.job /job` would differ in: its __main__ and argv,
    random seeds, torch's thread count."""
    import random

    import torch

    import inspector.job

    sys.modules["__main__"] = inspector.job  # messages say "the worker" by its __spec__
    sys.argv = [inspector.job.__file__, confine.JOB_MOUNT]

    random.seed()  # the zygote's state is every child's: reseed from the OS
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    torch.set_num_threads(threads)  # the first parallel op starts OpenMP here, not before
