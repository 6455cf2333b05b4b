"""fork_map: runs side by side in forked children, the same results as in this process."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest

from inspector import forkmap
from inspector.forkmap import ForkedRunFailed, Outcome, fork_map, side_by_side


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


def test_side_by_side_forks_the_runs_worth_it_and_works_meanwhile() -> None:
    """Outcomes in order; the runs marked worth a fork run in children while this process
    runs the others; where there is one core, everything runs here."""
    import time

    def nap(x: int) -> Callable[[], tuple[int, int]]:
        def run() -> tuple[int, int]:
            time.sleep(0.4)
            return x, os.getpid()

        return run

    here = os.getpid()
    start = time.perf_counter()
    got = side_by_side([(nap(1), True), (nap(2), False), (nap(3), False)])
    seconds = time.perf_counter() - start
    assert [o.get()[0] for o in got] == [1, 2, 3]
    assert got[1].get()[1] == got[2].get()[1] == here
    if forkmap._workers(2) >= 2:  # noqa: SLF001
        assert got[0].get()[1] != here
        assert seconds < 1.1  # the child's 0.4 s passed while this process ran 0.8 s
    else:
        assert got[0].get()[1] == here


class _TwoArgs(Exception):
    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} ({code})")


def test_side_by_side_keeps_what_each_run_raised() -> None:
    """A run's exception comes back as itself (its type and message), from a child as
    from this process; one that does not survive a pickle, or a crash, as ForkedRunFailed
    saying what happened. The other runs' outcomes stand."""
    if forkmap._workers(2) < 2:  # noqa: SLF001
        pytest.skip("one core: runs stay in this process")

    def raises(exc: BaseException) -> Callable[[], None]:
        def run() -> None:
            raise exc

        return run

    def crash() -> None:
        os.kill(os.getpid(), signal.SIGSEGV)

    def beside(run: Callable[[], None]) -> Outcome:
        """`run` in the one child a 2-core machine starts, one run here meanwhile (long
        enough for the child to take `run` from the queue before this process could)."""
        forked, here = side_by_side([(run, True), (lambda: (time.sleep(0.3), 5)[1], False)])
        assert here.get() == 5
        return forked

    with pytest.raises(ValueError, match="no rank 2 here"):
        beside(raises(ValueError("no rank 2 here"))).get()
    with pytest.raises(ForkedRunFailed, match=r"_TwoArgs: odd \(3\)"):
        beside(raises(_TwoArgs("odd", 3))).get()
    with pytest.raises(ForkedRunFailed, match=f"signal {int(signal.SIGSEGV)}"):
        beside(crash).get()
    [here] = side_by_side([(raises(KeyError("here")), False)])
    with pytest.raises(KeyError, match="here"):
        here.get()


def test_a_free_child_takes_the_next_queued_run_while_this_process_works() -> None:
    """Two queued runs of 0.3 s and one of 0.9 s here: the child runs both queued ones
    back to back while this process runs its own (0.9 s in all, not 1.2 s). A crash is
    charged to the run it was in, and the queue goes on without the child."""
    if forkmap._workers(2) < 2:  # noqa: SLF001
        pytest.skip("one core: runs stay in this process")

    def nap(seconds: float) -> Callable[[], int]:
        def run() -> int:
            time.sleep(seconds)
            return os.getpid()

        return run

    start = time.perf_counter()
    first, second, here = side_by_side([(nap(0.3), True), (nap(0.3), True), (nap(0.9), False)])
    seconds = time.perf_counter() - start
    assert here.get() == os.getpid()
    assert first.get() == second.get() != os.getpid()
    assert seconds < 1.15

    parent = os.getpid()

    def crash() -> None:
        if os.getpid() == parent:  # the child was slower to start than 0.3 s
            raise RuntimeError("the crashing run ran in this process")
        os.kill(os.getpid(), signal.SIGKILL)

    crashed, after, here = side_by_side([(crash, True), (nap(0.1), True), (nap(0.3), False)])
    with pytest.raises(ForkedRunFailed, match=f"signal {int(signal.SIGKILL)}"):
        crashed.get()
    assert after.get() == here.get() == os.getpid()  # the child had died: run here


def test_without_a_fork_the_queue_runs_here(monkeypatch) -> None:
    """Out of processes or memory, `fork` raises: every run is done here, none lost."""

    def refused() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(forkmap, "_may_fork", lambda: True)
    monkeypatch.setattr(forkmap, "_workers", lambda items: 2)
    monkeypatch.setattr(os, "fork", refused)
    got = side_by_side([(lambda: 1, True), (lambda: 2, True), (lambda: 3, False)])
    assert [o.get() for o in got] == [1, 2, 3]
