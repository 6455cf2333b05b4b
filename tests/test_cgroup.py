"""The per-job cgroup's word on how a job ended: a fork bomb that the process limit
stopped, then the memory limit, is named by its processes, not its memory."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

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
