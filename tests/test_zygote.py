"""The zygote on purpose-built uploads: a real zygote in a real bwrap sandbox, real forked
children running `inspector.job` on a job dir, watched by the real watchdog.

The uploads' top-level code runs as the job loads them; most print what they saw and
leave with os._exit(0), so each case costs a fork, not an analysis.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from hostile.kit import TINY_MODEL  # noqa: E402 (tests/ on sys.path)

from server.sandbox import Limits, sandbox_available
from server.sandbox.bwrap import runtime_paths
from server.sandbox.ending import ending_from_outcome
from server.sandbox.forked import run_forked
from server.sandbox.runner import Outcome
from server.sandbox.zygote import Zygote

MiB, GiB = 1024**2, 1024**3
LIMITS = Limits(wall_s=60, memory_bytes=3 * GiB, cpu_s=60, max_procs=16, max_file_bytes=8 * MiB)
READONLY = ("upload", "input", "job.json")
SAY = "import json, os, sys\ndef say(value):\n    print(json.dumps(value)); sys.stdout.flush()\n"
TINY = TINY_MODEL.decode()  # the hostile-upload tests' good model


pytestmark = pytest.mark.skipif(not sandbox_available()[0], reason=sandbox_available()[1])


@pytest.fixture(scope="module")
def jobs_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data") / "jobs"


@pytest.fixture(scope="module")
def zygote(jobs_root):
    zygote = Zygote.start(jobs_root, LIMITS)
    try:
        info = zygote.wait_ready(600)
        assert info["ready"] and info["modules"] > 100  # it learned the first analysis' imports
        yield zygote
    finally:
        zygote.close()


def run_upload(zygote: Zygote, code: str, limits: Limits = LIMITS) -> tuple[Outcome, Path]:
    job = zygote.jobs_root / f"1-{secrets.token_hex(6)}"
    for sub in ("upload", "input"):
        (job / sub).mkdir(parents=True)
    (job / "upload" / "model.py").write_text(code)
    spec = {"model": "upload/model.py:Net", "input": None, "options": {"device": "cpu"}}
    (job / "job.json").write_text(json.dumps(spec))
    return run_forked(zygote, job, limits, readonly=READONLY), job


def said(outcome: Outcome) -> dict:
    assert outcome.status == "done", (outcome.status, outcome.reason, outcome.stderr[-2000:])
    return json.loads(outcome.stdout.strip().splitlines()[-1])


def _status_fields(text: str) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def test_a_forked_child_is_confined_like_a_fresh_one(zygote, tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = (
            SAY
            + f"""
import ctypes, socket
libc = ctypes.CDLL(None, use_errno=True)
status = dict(l.split(":\\t", 1) for l in open("/proc/self/status").read().splitlines())
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2); net = "connected"
except OSError as e:
    net = e.errno
unshare = [libc.unshare(0x00020000), ctypes.get_errno()]  # CLONE_NEWNS
mount = [libc.mount(b"none", b"/tmp", b"tmpfs", 0, None), ctypes.get_errno()]
def readable(path):
    try:
        open(path, "rb").read(1); return True
    except OSError:
        return False
writes = {{}}
for p in ["{tmp_path}/x", "/usr/x", "/jobs/x", "/dev/x", "/tmp/ok", "/job/ok", "/job/upload/x"]:
    try:
        open(p, "w").write("x"); writes[p] = "wrote"
    except OSError as e:
        writes[p] = e.errno
say({{"uid": os.getuid(), "pid": os.getpid(), "cwd": os.getcwd(),
     "caps": [status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
     "nnp": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
     "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
     "jobs": os.listdir("/jobs"), "hostproc": os.listdir("/run/hostproc"),
     "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
     "init": [readable("/proc/1/" + f) for f in ("mem", "environ", "cwd/job.json")],
     "net": net, "unshare": unshare, "mount": mount, "writes": writes,
     "oom": open("/proc/self/oom_score_adj").read().strip(),
     "env": sorted(os.environ)}})
os._exit(0)
"""
        )
        outcome, job = run_upload(zygote, code)
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing reached the host's loopback
    seen = said(outcome)
    assert seen["uid"] == 65534 and seen["cwd"] == "/job"
    assert seen["pid"] == 2 and seen["pids"] == [1, 2]  # its own pid namespace and /proc
    assert seen["caps"] == ["0000000000000000"] * 5  # bounding set too
    assert (seen["nnp"], seen["seccomp"]) == ("1", "2")  # no_new_privs, a seccomp filter
    assert seen["jobs"] == [] and seen["hostproc"] == []  # what the zygote sees is hidden
    assert seen["fds"] == [0, 1, 2, 3]  # 3: the listing itself; not the zygote's socket
    assert seen["init"] == [False] * 3  # its namespace's init, ours, is closed to it
    assert seen["net"] == 13 and seen["unshare"] == [-1, 1] and seen["mount"] == [-1, 1]
    writes = seen["writes"]
    assert writes["/tmp/ok"] == "wrote" and writes["/job/ok"] == "wrote"
    assert {writes[p] for p in writes if not p.endswith("ok")} <= {13, 30, 2}  # EACCES/EROFS
    assert not (tmp_path / "x").exists() and (job / "ok").read_text() == "x"
    assert "INSPECTOR_DATABASE_URL" not in seen["env"] and "HOME" in seen["env"]
    assert seen["oom"] == "1000"  # out of memory, the kernel kills the job, not the worker


def test_a_job_cannot_see_another_jobs_files_or_leftovers(zygote):
    token = secrets.token_hex(6)
    other = zygote.jobs_root / f"2-{token}"
    (other / "upload").mkdir(parents=True)
    (other / "upload" / f"secret{token}.py").write_text("SECRET = 'the other upload'")
    leave = SAY + (
        f"open('/tmp/left{token}', 'w').write('x'); open('/dev/shm/left{token}', 'w').write('x')\n"
        f"try: open('/dev/left{token}', 'w')\nexcept OSError: pass\n"
        "import subprocess; subprocess.Popen(['sleep', '600'])\n"  # a straggler
        "say('left'); os._exit(0)\n"
    )
    assert said(run_upload(zygote, leave)[0]) == "left"
    look = SAY + (
        "found = [os.path.join(d, f) for d, _, fs in os.walk('/') if not d.startswith('/proc')"
        f" for f in fs if '{token}' in f]\n"
        "say({'found': found, 'tmp': os.listdir('/tmp'), 'shm': os.listdir('/dev/shm'),"
        " 'pids': [p for p in os.listdir('/proc') if p.isdigit()]}); os._exit(0)\n"
    )
    seen = said(run_upload(zygote, look)[0])
    # /tmp is fresh but for the runtime bound there, as in a fresh child (a checkout in /tmp)
    runtime_in_tmp = sorted({p.split("/")[2] for p in runtime_paths() if p.startswith("/tmp/")})
    assert seen == {"found": [], "tmp": runtime_in_tmp, "shm": [], "pids": ["1", "2"]}
    assert _zygote_tasks(zygote) == 1  # and the straggler died with its job


def _zygote_tasks(zygote: Zygote) -> int:
    """Processes in the zygote's sandbox now: bwrap's init and the zygote only."""
    from server.sandbox.procs import tree_pids

    return len(tree_pids(zygote.proc.pid)) - 2


def test_a_crash_a_timeout_and_a_memory_hog_do_not_break_the_next_job(zygote):
    pid = zygote.proc.pid
    crash, _ = run_upload(zygote, "import ctypes\nctypes.string_at(0)\n")
    assert (crash.status, crash.signal) == ("killed", "SIGSEGV")
    looping, _ = run_upload(zygote, "while True: pass\n", replace(LIMITS, wall_s=2))
    assert looping.status == "timed_out" and "2 s" in looping.reason
    spinning, _ = run_upload(zygote, "while True: pass\n", replace(LIMITS, cpu_s=1))
    assert (spinning.status, spinning.signal) == ("timed_out", "SIGXCPU")  # not pid 1: it dies
    term, _ = run_upload(zygote, "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    assert (term.status, term.signal) == ("killed", "SIGTERM")
    hog = "x = []\nwhile True: x.append(bytearray(64 * 2**20))\n"  # touched: RSS grows
    hogged, job = run_upload(zygote, hog, replace(LIMITS, memory_bytes=1 * GiB))
    assert ending_from_outcome(hogged, job, "load").status == "out_of_memory", hogged
    bomb = "import os, time\nwhile True:\n    try: os.fork()\n    except OSError: time.sleep(0.1)\n"
    bombed, _ = run_upload(zygote, bomb)
    assert bombed.status == "killed" and "processes" in bombed.reason
    done, job = run_upload(zygote, TINY)
    assert done.status == "done", done.stderr[-2000:]
    report = json.loads((job / "report.json").read_text())
    assert report["totals"]["params"] == 8 * 4 + 4  # Linear(8, 4)
    assert zygote.alive and zygote.proc.pid == pid and _zygote_tasks(zygote) == 1


def test_the_zygote_never_runs_the_uploads_code(zygote):
    """An upload that poisons everything it can reach: the zygote, and so the next job, is
    untouched, because only the forked child ever imported it."""
    poison = SAY + (
        "import builtins, torch\n"
        "builtins.POISONED = True\n"
        "torch.nn.Linear.forward = lambda self, x: 1 / 0\n"
        "os.kill(1, 9); os.kill(os.getppid(), 9)\n"  # its init ignores it
        "os.kill(os.getpid(), 9)\n"
    )
    outcome, _ = run_upload(zygote, poison)
    assert outcome.status == "killed"
    check = SAY + (
        "import builtins, torch\n"
        "say({'poisoned': hasattr(builtins, 'POISONED'),"
        " 'forward': torch.nn.Linear.forward.__module__}); os._exit(0)\n"
    )
    assert said(run_upload(zygote, check)[0]) == {
        "poisoned": False,
        "forward": "torch.nn.modules.linear",
    }
    zygote_root = Path(f"/proc/{_zygote_pid(zygote)}")
    assert "model" not in (zygote_root / "cmdline").read_text()
    assert len(os.listdir(zygote_root / "task")) == 1  # no thread of a job in it either


def _zygote_pid(zygote: Zygote) -> int:
    from server.sandbox.procs import tree_pids

    for pid in tree_pids(zygote.proc.pid):
        if b"inspector.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError("no zygote process")


def test_a_request_for_a_dir_outside_the_jobs_folder_is_refused(zygote, tmp_path):
    from server.sandbox.zygote import ZygoteError

    with pytest.raises(ZygoteError, match="not in the zygote's jobs folder"):
        run_forked(zygote, tmp_path, LIMITS)
    assert zygote.alive
