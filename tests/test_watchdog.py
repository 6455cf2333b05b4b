"""The watchdog's order of checks on a real process tree: processes are counted before any
memory is read, so a fork bomb is stopped at its count however large it has grown (reading
thousands of processes' memory let a root job's bomb outgrow the watchdog)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.sandbox import runner
from server.sandbox.limits import Limits
from server.sandbox.procs import kill_tree, tree_pids
from server.sandbox.runner import Watch

SLEEPERS = (
    "import os, sys, time\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    if os.fork() == 0:\n"
    "        time.sleep(60); os._exit(0)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def tree(request):
    """A parent with N sleeping children (N from the test's parameter)."""
    parent = subprocess.Popen([sys.executable, "-c", SLEEPERS, str(request.param)])
    deadline = time.monotonic() + 30
    while len(tree_pids(parent.pid)) < request.param + 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    yield parent.pid
    kill_tree(parent.pid)
    parent.wait()


def _watch(max_procs: int, tmp_path: Path) -> Watch:
    limits = Limits(max_procs=max_procs, memory_bytes=1 << 40)
    watch = Watch(limits, tmp_path, time.monotonic(), (0, 0))
    watch.overhead_procs = 0  # no sandbox here: every process of the tree is the job's
    return watch


@pytest.mark.parametrize("tree", [6], indirect=True)
def test_too_many_processes_is_named_without_reading_their_memory(tree, tmp_path, monkeypatch):
    def no_memory_reads(pids):
        raise AssertionError("memory read for a tree already past its process limit")

    monkeypatch.setattr(runner, "tree_memory", no_memory_reads)
    watch = _watch(max_procs=3, tmp_path=tmp_path)
    assert watch.breach(tree) == ("killed", "started more than 3 processes")
    assert watch.peak_procs == 7 and watch.peak_rss == 0


@pytest.mark.parametrize("tree", [2], indirect=True)
def test_a_tree_within_its_process_limit_has_its_memory_read(tree, tmp_path):
    watch = _watch(max_procs=3, tmp_path=tmp_path)
    assert watch.breach(tree) is None
    # three Python processes: a few MiB each at least, shared pages counted once
    assert watch.peak_procs == 3 and watch.peak_rss > 3 * 2**20
