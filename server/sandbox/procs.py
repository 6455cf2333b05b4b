"""The child's process tree, read from /proc (no psutil): who is in it, how much memory."""

from __future__ import annotations

import contextlib
import os
import signal

__all__ = ["tree_pids", "tree_memory", "tree_resident_bound", "kill_tree", "ns_pids"]

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _parent_map() -> dict[int, list[int]]:
    """ppid -> children, for every process we can see."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        ppid = _ppid(int(name))
        if ppid is not None:
            children.setdefault(ppid, []).append(int(name))
    return children


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # gone between listdir and open
        return None
    # The command name may hold spaces and parentheses: split after the last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def tree_pids(root: int) -> list[int]:
    """`root` and all its descendants (orphans inside the sandbox are reparented to its
    pid-namespace init, which is itself a descendant, so the tree stays whole)."""
    children = _parent_map()
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _resident_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def tree_resident_bound(pids: list[int] | tuple[int, ...]) -> int:
    """Resident set sizes summed over `pids`: a page shared by several forks is counted in
    each, so never less than `tree_memory`. Read from counters the kernel keeps (statm),
    where `tree_memory` walks every mapping of every process: 2 ms against 120 ms for a
    1 GB process and five forks of it."""
    return sum(_resident_bytes(pid) for pid in pids)


def _memory_bytes(pid: int) -> int:
    """Proportional set size: pages shared by forked children count once in all, so a
    tree of forks is not charged N times its parent (plain RSS where PSS is missing)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return _resident_bytes(pid)


def tree_memory(pids: list[int] | tuple[int, ...]) -> int:
    """Proportional set size summed over `pids`: pages shared by the tree counted once."""
    return sum(_memory_bytes(pid) for pid in pids)


def kill_tree(root: int, pids: list[int] | tuple[int, ...] = ()) -> None:
    """SIGKILL the process group of `root` and every pid of its tree still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(root, signal.SIGKILL)  # started with start_new_session: pgid == pid
    for pid in set(pids) | set(tree_pids(root)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def ns_pids(pid: int) -> list[int]:
    """`pid`'s numbers from our pid namespace inwards (`NSpid:` of /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return [int(n) for n in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []
