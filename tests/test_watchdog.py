"""The watchdog's order of checks on a real process tree: processes are counted before any
memory is read, so a fork bomb is stopped at its count however large it has grown (reading
thousands of processes' memory let a root job's bomb outgrow the watchdog). And what its
memory reads cost the job it watches: the walk of every mapping only where the resident
sizes summed pass the limit, or once in twenty times its own cost."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.sandbox import runner
from server.sandbox.limits import Limits
from server.sandbox.procs import kill_tree, tree_memory, tree_pids, tree_resident_bound
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


@pytest.mark.parametrize("tree", [3], indirect=True)
def test_the_resident_bound_is_never_below_the_proportional_size(tree):
    pids = tree_pids(tree)
    bound, used = tree_resident_bound(pids), tree_memory(pids)
    # four Python processes sharing the parent's pages: each counted in every sharer
    assert bound >= used > 4 * 2**20
    statm = sum(int(Path(f"/proc/{p}/statm").read_text().split()[1]) for p in pids)
    assert abs(bound - statm * os.sysconf("SC_PAGE_SIZE")) <= 64 * 4096  # pages move


@pytest.mark.parametrize("tree", [2], indirect=True)
def test_memory_is_read_at_most_once_in_twenty_times_its_cost(tree, tmp_path, monkeypatch):
    reads = []  # (when it began, how long it took)

    def slow_read(pids):  # a read of 0.05 s or more: the next one 20 times that later
        began = time.monotonic()
        time.sleep(0.05)
        reads.append((began, time.monotonic() - began))
        return 2**20

    monkeypatch.setattr(runner, "tree_memory", slow_read)
    watch = _watch(max_procs=3, tmp_path=tmp_path)
    polls, stop = 0, time.monotonic() + 10
    while len(reads) < 2 and time.monotonic() < stop:
        assert watch.breach(tree) is None
        polls += 1
        time.sleep(0.01)
    assert len(reads) == 2
    (first, took), (second, _) = reads
    assert second - first >= runner.MEMORY_READ_EVERY * took  # at least 1 s apart
    assert polls > 20  # and every poll between them went without a read
    assert watch.peak_rss == 2**20


@pytest.mark.parametrize("tree", [2], indirect=True)
def test_a_tree_past_its_memory_limit_is_read_at_once(tree, tmp_path, monkeypatch):
    watch = _watch(max_procs=3, tmp_path=tmp_path)
    assert watch.breach(tree) is None  # a read: the next one not due for a while
    watch.next_memory_read = time.monotonic() + 3600
    used = tree_memory(tree_pids(tree))
    # a limit under what the tree uses: its resident bound is past it too, so it is read now
    watch.limits = dataclasses.replace(watch.limits, memory_bytes=used // 2)
    status, reason = watch.breach(tree)
    assert status == "out_of_memory" and "memory limit" in reason
