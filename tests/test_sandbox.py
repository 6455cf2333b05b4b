"""The sandbox on purpose-built children (plain Python, no torch: each runs in ~0.1 s).

Every case asserts the named ending AND that the host saw nothing: no connection on the
listener, no file outside the job dir, no secret in the child's environment.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from server.sandbox import JOB_MOUNT, Limits, Outcome, run_child, sandbox_available
from server.sandbox.childfiles import ProgressReader, read_child_file, read_child_json
from server.sandbox.ending import crash_location, ending_from_outcome
from server.sandbox.output import CappedStream

MiB = 1024**2
FAST = Limits(wall_s=20, memory_bytes=512 * MiB, cpu_s=20, max_procs=16, max_file_bytes=8 * MiB)

pytestmark = pytest.mark.skipif(not sandbox_available()[0], reason=sandbox_available()[1])


def run_py(tmp_path: Path, code: str, limits: Limits = FAST) -> Outcome:
    job = tmp_path / "job"
    job.mkdir(exist_ok=True)
    return run_child([sys.executable, "-c", code], job, limits)


def test_probe_says_bubblewrap():
    ok, why = sandbox_available()
    assert ok and "bubblewrap" in why


def test_child_runs_as_nobody_with_a_scrubbed_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("INSPECTOR_DATABASE_URL", "postgresql://u:SECRET-PW@db/x")
    code = "import os, json; print(json.dumps([os.getuid(), os.getcwd(), dict(os.environ)]))"
    outcome = run_py(tmp_path, code)
    assert outcome.status == "done", outcome
    assert "SECRET-PW" not in outcome.stdout and "INSPECTOR_" not in outcome.stdout
    assert outcome.stdout.startswith(f'[65534, "{JOB_MOUNT}", ')
    assert '"HOME": "/tmp"' in outcome.stdout


def test_no_network_the_listener_receives_nothing(tmp_path):
    accepted: list[object] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('CONNECTED')\n"
            "except OSError as e:\n"
            "    print('refused', e.errno)\n"
        )
        outcome = run_py(tmp_path, code)
        with contextlib.suppress(TimeoutError):
            accepted.append(server.accept())
    assert outcome.status == "done", outcome
    assert outcome.stdout.strip() == "refused 13"  # EACCES: seccomp, before any packet
    assert accepted == []


@pytest.mark.parametrize("family", ["AF_INET6", "AF_NETLINK", "AF_PACKET"])
def test_other_socket_families_are_refused(tmp_path, family):
    code = (
        "import socket\n"
        f"try: socket.socket(socket.{family}, socket.SOCK_RAW if '{family}' != 'AF_INET6' "
        "else socket.SOCK_STREAM)\nexcept OSError as e: print('refused', e.errno)\n"
    )
    outcome = run_py(tmp_path, code)
    assert outcome.stdout.strip() == "refused 13"


def test_namespaces_and_ptrace_are_refused(tmp_path):
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
        "print(libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"  # PTRACE_ATTACH to pid 1
    )
    outcome = run_py(tmp_path, code)
    assert outcome.stdout.split() == ["-1", "1", "-1", "1"]  # EPERM twice


def test_writes_outside_the_job_dir_do_not_reach_the_host(tmp_path):
    host_file = tmp_path / "outside.txt"
    code = (
        "import os\n"
        f"for p in [{str(host_file)!r}, '/work/x', '/usr/x', '/tmp/ok', '{JOB_MOUNT}/ok']:\n"
        "    try:\n"
        "        open(p, 'w').write('x'); print('wrote', p)\n"
        "    except OSError as e:\n"
        "        print('no', p, e.errno)\n"
    )
    outcome = run_py(tmp_path, code)
    assert not host_file.exists()
    assert "wrote /tmp/ok" in outcome.stdout and f"wrote {JOB_MOUNT}/ok" in outcome.stdout
    assert outcome.stdout.count("no ") == 3
    assert (tmp_path / "job" / "ok").read_text() == "x"  # the job dir is the one way out


def test_host_files_are_not_visible(tmp_path):
    secret = tmp_path / "inspector.db"
    secret.write_text("the database")
    code = f"import os; print(os.path.exists({str(secret)!r}), sorted(os.listdir('/')))"
    outcome = run_py(tmp_path, code)
    assert outcome.stdout.startswith("False ")
    assert "'root'" in outcome.stdout and "'home'" not in outcome.stdout  # only what we bound


def test_segfault_is_killed_with_the_signal_name(tmp_path):
    outcome = run_py(tmp_path, "import ctypes; ctypes.string_at(0)")
    assert (outcome.status, outcome.signal) == ("killed", "SIGSEGV")


def test_killing_its_parent_hits_only_the_sandbox(tmp_path):
    outcome = run_py(tmp_path, "import os; os.kill(os.getppid(), 9); print('alive', os.getppid())")
    # Its parent is the sandbox's pid-1, which ignores signals from inside: nothing died.
    assert outcome.status == "done" and outcome.stdout.strip() == "alive 1"


def test_an_endless_loop_times_out(tmp_path):
    limits = Limits(wall_s=1.0, memory_bytes=512 * MiB, cpu_s=30, max_procs=16)
    start = time.monotonic()
    outcome = run_py(tmp_path, "while True: pass", limits)
    assert outcome.status == "timed_out" and "1 s" in outcome.reason
    assert time.monotonic() - start < 10


def test_cpu_limit_is_a_timeout_too(tmp_path):
    limits = Limits(wall_s=30, memory_bytes=512 * MiB, cpu_s=1, max_procs=16)
    outcome = run_py(tmp_path, "while True: pass", limits)
    assert (outcome.status, outcome.signal) == ("timed_out", "SIGXCPU")


def test_touched_memory_past_the_limit_is_out_of_memory(tmp_path):
    code = "x = []\nwhile True: x.append(b'1' * (32 * 2**20))"  # touched pages: RSS grows
    outcome = run_py(tmp_path, code)
    assert outcome.status == "out_of_memory", outcome
    assert outcome.peak_rss_bytes > 400 * MiB  # the watchdog saw it pass ~512 MiB


def test_address_space_limit_fails_the_allocation_inside(tmp_path):
    # 8 GiB untouched: only RLIMIT_AS (max(512 MiB + 1 GiB, 3 GiB)) can stop it.
    code = "import mmap\ntry: mmap.mmap(-1, 8 * 2**30)\n"
    code += "except OSError as e: print('refused', e.errno)"
    outcome = run_py(tmp_path, code)
    assert outcome.stdout.strip() == "refused 12"  # ENOMEM


def test_fork_bomb_is_stopped_and_leaves_nothing_behind(tmp_path):
    marker = f"forkbomb-{os.getpid()}-{time.monotonic_ns()}"
    code = f"import os, time  # {marker}\nwhile True:\n"
    code += "    try: os.fork()\n    except OSError: time.sleep(0.01)"
    outcome = run_py(tmp_path, code)
    assert outcome.status == "killed" and "processes" in outcome.reason, outcome
    time.sleep(0.2)
    survivors = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, marker)]
    assert survivors == []


def _cmdline_has(pid: str, marker: str) -> bool:
    try:
        return marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_megabytes_of_output_are_capped(tmp_path):
    limits = Limits(wall_s=30, memory_bytes=512 * MiB, cpu_s=30, output_bytes=4096)
    code = "import sys\nfor _ in range(200): sys.stdout.write('x' * 100_000)\nprint('END')"
    outcome = run_py(tmp_path, code, limits)
    assert outcome.status == "done"
    assert outcome.output_bytes == 200 * 100_000 + 4  # every byte drained: 'END\n' last
    assert len(outcome.stdout) < 4096 + 100 and outcome.stdout.endswith("END\n")


def test_file_size_and_file_count_limits(tmp_path):
    big = "f = open('big', 'wb')\ntry:\n    f.write(b'x' * (16 * 2**20))\n"
    big += "except OSError as e: print(e.errno)"
    assert run_py(tmp_path, big).stdout.strip() == "27"  # EFBIG at the 8 MiB RLIMIT_FSIZE
    limits = Limits(wall_s=30, memory_bytes=512 * MiB, cpu_s=30, max_job_files=50)
    many = "import os, time\nfor i in range(5000): open(f'f{i}', 'w')\ntime.sleep(5)"
    outcome = run_py(tmp_path, many, limits)
    assert outcome.status == "killed" and "files" in outcome.reason


def test_tmp_is_a_small_tmpfs(tmp_path):
    limits = Limits(wall_s=30, memory_bytes=512 * MiB, cpu_s=30, tmp_bytes=4 * MiB)
    code = "try: open('/tmp/f', 'wb').write(b'x' * (8 * 2**20))\n"
    code += "except OSError as e: print(e.errno)"
    assert run_py(tmp_path, code, limits).stdout.strip() == "28"  # ENOSPC


def test_the_child_runs_nicer_than_its_worker_and_the_watchdog_does_not(tmp_path):
    own = os.getpriority(os.PRIO_PROCESS, 0)
    code = "import os, time; print(os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0))"
    code += "; time.sleep(0.5)"
    watchdog: list[int] = []  # on_tick runs on the thread that watches the child

    def tick() -> None:
        watchdog.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    job = tmp_path / "job"
    job.mkdir()
    niced = run_child([sys.executable, "-c", code], job, replace(FAST, nice=7), on_tick=tick)
    plain = run_py(tmp_path, code, replace(FAST, nice=0))
    idle = run_py(tmp_path, code, replace(FAST, nice=0, sched_idle=True))
    assert niced.status == plain.status == idle.status == "done", (niced, plain, idle)
    # `nice -n 7` adds to the worker's own niceness; 0 runs no `nice` at all.
    assert niced.stdout.split() == [str(min(own + 7, 19)), str(os.SCHED_OTHER)]
    assert plain.stdout.split() == [str(own), str(os.SCHED_OTHER)]
    assert idle.stdout.split() == [str(own), str(os.SCHED_IDLE)]
    assert watchdog and set(watchdog) == {own}  # the worker's threads keep their priority
    assert os.getpriority(os.PRIO_PROCESS, 0) == own
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_the_kernel_kills_the_child_first_when_memory_runs_out(tmp_path):
    code = "print(open('/proc/self/oom_score_adj').read().strip())"
    done = run_py(tmp_path, code)
    assert (done.status, done.stdout.strip()) == ("done", "1000")  # the worst score there is
    with open("/proc/self/oom_score_adj") as f:
        assert int(f.read()) < 1000  # and the worker's own is untouched


def test_job_limits_take_the_priority_settings():
    from server.settings import Settings

    default = Limits.from_settings(Settings())
    assert (default.nice, default.sched_idle) == (10, False)  # INSPECTOR_JOB_NICE's default
    chosen = Limits.from_settings(Settings(job_nice=0, job_sched_idle=True))
    assert (chosen.nice, chosen.sched_idle) == (0, True)


def test_should_stop_interrupts(tmp_path):
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    job = tmp_path / "job"
    job.mkdir()
    outcome = run_child([sys.executable, "-c", "import time; time.sleep(60)"], job, FAST,
                        should_stop=stop.is_set)  # fmt: skip
    assert outcome.status == "interrupted"


# --- reading what the child left, without trusting it -------------------------------------


def test_child_files_links_fifos_and_big_files_are_refused(tmp_path):
    (tmp_path / "secret").write_text('{"kind": "host"}')
    (tmp_path / "link.json").symlink_to(tmp_path / "secret")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "big.json").write_text('{"a": "' + "x" * 100 + '"}')
    (tmp_path / "ok.json").write_text('{"a": 1}')
    assert read_child_json(tmp_path / "link.json", 1000) is None
    assert read_child_json(tmp_path / "fifo.json", 1000) is None  # and did not block
    assert read_child_file(tmp_path / "big.json", 50) is None
    assert read_child_json(tmp_path / "ok.json", 50) == {"a": 1}


def test_progress_reader_follows_appended_lines(tmp_path):
    path = tmp_path / "progress.jsonl"
    reader = ProgressReader(path)
    assert reader.poll() is False  # no file yet
    path.write_text('{"stage": "load", "percent": 0, "t": 5.0}\n{"stage": "capt')
    assert reader.poll() and (reader.stage, reader.percent) == ("load", 0)
    with path.open("a") as f:
        f.write('ure", "percent": 10}\nnot json\n{"stage": "x", "percent": 900}\n')
    assert reader.poll() and (reader.stage, reader.percent) == ("x", 100)  # clamped
    assert reader.times == {"load": 5.0}


def test_capped_stream_keeps_head_and_tail():
    read, write = os.pipe()
    stream = CappedStream(os.fdopen(read, "rb"), keep_bytes=8)
    os.write(write, b"0123456789" * 3)
    os.close(write)
    stream.join(5)
    assert stream.total_bytes == 30 and stream.truncated
    assert stream.text() == "0123\n[... 22 bytes not kept ...]\n6789"


def test_crash_location_from_faulthandler():
    dump = (
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n"
        '  File "/opt/x/ctypes/__init__.py", line 519 in string_at\n'
        '  File "/job/upload/model.py", line 7 in __init__\n'
    )
    assert crash_location(dump) == "model.py:7"


def test_done_without_report_is_an_internal_failure(tmp_path):
    ending = ending_from_outcome(Outcome("done", "finished", exit_code=0), tmp_path, "passes")
    assert ending.status == "failed" and ending.error["kind"] == "internal"
    assert ending.report["status"] == "failed"


def test_error_json_maps_to_status(tmp_path):
    (tmp_path / "error.json").write_text(
        '{"kind": "out_of_memory", "message": "MemoryError", "stage": "capture", "traceback": ""}'
    )
    ending = ending_from_outcome(Outcome("failed", "exited with status 1", 1), tmp_path, "load")
    assert (ending.status, ending.stage) == ("out_of_memory", "capture")
    assert "fake=true" in ending.error["message"]  # says what to do


def test_a_job_dir_inside_the_bound_runtime_is_refused():
    from server.sandbox.bwrap import bwrap_argv

    for inside in (Path(sys.prefix) / "data" / "jobs" / "1-x", Path("/usr/local/jobs/1-x")):
        with pytest.raises(ValueError, match="must not lie inside the runtime"):
            bwrap_argv(inside, ["true"], env={}, seccomp_fd=3, tmp_bytes=MiB)
