"""The per-job cgroup's word on how a job ended: a fork bomb that the process limit
stopped, then the memory limit, is named by its processes, not its memory."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from server.sandbox import cgroup as cgroup_module
from server.sandbox.cgroup import JobCgroup
from server.sandbox.limits import Limits
from server.sandbox.runner import name_ending


@dataclass
class _Group:
    oom: bool
    forks_refused: bool

    def oom_killed(self) -> bool:
        return self.oom

    def refused_forks(self) -> bool:
        return self.forks_refused


def test_out_of_memory_after_refused_forks_is_named_by_its_processes() -> None:
    limits = Limits(max_procs=32)
    bomb = name_ending(-9, None, _Group(oom=True, forks_refused=True), limits)
    assert bomb.status == "killed" and bomb.reason.startswith("started more than 32 processes")
    memory = name_ending(-9, None, _Group(oom=True, forks_refused=False), limits)
    assert memory.status == "out_of_memory" and "memory limit" in memory.reason
    # a job that finished is done, whatever the process limit refused on the way
    assert name_ending(0, None, _Group(oom=False, forks_refused=True), limits).status == "done"


def test_a_refused_fork_is_counted_by_the_group() -> None:
    group = JobCgroup.create(max_procs=3, memory_bytes=1 << 30)
    if group is None:
        pytest.skip("this host gives no per-job cgroup (the watchdog alone counts processes)")
    try:
        assert not group.refused_forks()
        # a child joins the group, then forks five sleepers: pids.max (3) refuses some
        code = (
            "import os, sys, time\n"
            "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
            "for _ in range(5):\n"
            "    try:\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(0.5); os._exit(0)\n"
            "    except OSError:\n"
            "        pass\n"
        )
        for procs in group.procs_files:
            joined = subprocess.run([sys.executable, "-c", code, procs], timeout=60)
            assert joined.returncode == 0
        assert group.refused_forks()
    finally:
        group.kill()
        group.remove()


def _group_of(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        return f.read()


def test_a_child_forked_while_its_parent_is_moved_in_is_moved_in_too(monkeypatch) -> None:
    """The race a zygote's job has: its outer process forks the pid namespace's init just
    after we look at its tree and before we move it. The init, and so the job under it,
    must not be left outside the group's process and memory limits."""
    group = JobCgroup.create(max_procs=8, memory_bytes=1 << 30)
    if group is None:
        pytest.skip("this host gives no per-job cgroup (the watchdog alone counts processes)")
    forker = (
        "import os, sys, time\n"
        "sys.stdin.readline()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(60); os._exit(0)\n"
        "print(pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", forker], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    looks: list[list[int]] = []
    real_tree_pids = cgroup_module.tree_pids

    def tree_pids_then_fork(root: int) -> list[int]:
        pids = real_tree_pids(root)
        if not looks:  # the first look: the parent forks before it is moved
            parent.stdin.write("fork\n")
            parent.stdin.flush()
            int(parent.stdout.readline())
        looks.append(pids)
        return pids

    monkeypatch.setattr(cgroup_module, "tree_pids", tree_pids_then_fork)
    try:
        group.enter_tree(parent.pid)
        child = [pid for pid in real_tree_pids(parent.pid) if pid != parent.pid]
        assert looks[0] == [parent.pid] and len(child) == 1  # the child came after the look
        for pid in (parent.pid, *child):
            assert all(f"/{path.name}\n" in _group_of(pid) for path in group.dirs), pid
        assert len(looks) == 3  # moved the parent, then the child, then nothing new
    finally:
        parent.kill()
        group.kill()
        parent.wait()
        group.remove()
