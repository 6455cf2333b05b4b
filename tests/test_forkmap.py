"""fork_map: runs side by side in forked children, the same results as in this process."""

from __future__ import annotations

import os
import signal

import pytest

from inspector import forkmap
from inspector.forkmap import ForkedRunFailed, fork_map


def _where(x: int) -> tuple[int, int, list[int]]:
    nested = fork_map(lambda y: os.getpid(), [1, 2])  # inside a child: no second level
    return x * x, os.getpid(), nested


def test_results_in_order_from_children_when_there_are_cores() -> None:
    got = fork_map(_where, [3, 4, 5])
    assert [square for square, _, _ in got] == [9, 16, 25]
    pids = {pid for _, pid, _ in got}
    if forkmap._workers(3) >= 2:  # noqa: SLF001 - on one core everything runs here
        assert os.getpid() not in pids
        for _, pid, nested in got:
            assert nested == [pid, pid]  # a child runs its own map in itself
    else:
        assert pids == {os.getpid()}


def test_a_failed_run_says_what_happened() -> None:
    if forkmap._workers(2) < 2:  # noqa: SLF001
        pytest.skip("one core: runs stay in this process")

    def boom(x: int) -> int:
        if x == 2:
            raise ValueError("no rank 2 here")
        return x

    with pytest.raises(ForkedRunFailed, match="ValueError: no rank 2 here"):
        fork_map(boom, [1, 2])

    def crash(x: int) -> int:
        os.kill(os.getpid(), signal.SIGSEGV)
        return x

    with pytest.raises(ForkedRunFailed, match=f"signal {int(signal.SIGSEGV)}"):
        fork_map(crash, [1, 2])


def test_only_runs_slower_than_a_fork_are_forked() -> None:
    """fork_map_if_slow: forked children for runs that take a fork's cost or more."""
    from inspector.forkmap import FORK_WORTH_SECONDS, fork_map_if_slow

    def where(x: int) -> tuple[int, int]:
        return x + 1, os.getpid()

    here = os.getpid()
    quick = fork_map_if_slow(where, [1, 2, 3], seconds=FORK_WORTH_SECONDS / 10)
    assert quick == [(2, here), (3, here), (4, here)]
    slow = fork_map_if_slow(where, [1, 2, 3], seconds=FORK_WORTH_SECONDS)
    assert [v for v, _ in slow] == [2, 3, 4]
    if forkmap._workers(3) >= 2:  # noqa: SLF001 - on one core everything runs here
        assert here not in {pid for _, pid in slow}
