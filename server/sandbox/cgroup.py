"""An optional per-job cgroup: a hard ceiling on processes and memory where we may make one.

Used when the worker can create cgroups (root in a container, a delegated systemd unit):
cgroup v2 (`pids.max`, `memory.max`) or v1 (`pids` and `memory` hierarchies). Elsewhere
the parent's watchdog is the only count; nothing here is required for the sandbox to work.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from server.sandbox.procs import tree_pids

__all__ = ["JobCgroup"]

MiB = 1024**2


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, options) of the cgroup filesystems."""
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 3 and parts[2] in ("cgroup", "cgroup2"):
                found.append((parts[1], parts[2], set(parts[3].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """controller (or "" for v2) -> our cgroup path, from /proc/self/cgroup."""
    paths = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


@dataclass
class JobCgroup:
    dirs: list[Path] = field(default_factory=list)  # one per hierarchy (v1) or one (v2)
    memory_dir: Path | None = None
    pids_dir: Path | None = None
    version: int = 1

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    @classmethod
    def create(cls, max_procs: int, memory_bytes: int) -> JobCgroup | None:
        name = f"inspector-job-{secrets.token_hex(6)}"
        group = cls._create_v2(name, max_procs, memory_bytes)
        return group or cls._create_v1(name, max_procs, memory_bytes)

    @classmethod
    def _create_v2(cls, name: str, max_procs: int, memory_bytes: int) -> JobCgroup | None:
        own = _own_paths().get("")
        for mount, fstype, _ in _mounts():
            parent = Path(mount + (own or "/"))
            controllers = _read(parent / "cgroup.subtree_control").split()
            if fstype != "cgroup2" or not {"pids", "memory"} <= set(controllers):
                continue
            group = cls(version=2)
            if group._make(parent / name, {"pids.max": max_procs, "memory.max": memory_bytes}):
                group.memory_dir = group.pids_dir = parent / name
                return group
            group.remove()
        return None

    @classmethod
    def _create_v1(cls, name: str, max_procs: int, memory_bytes: int) -> JobCgroup | None:
        own = _own_paths()
        group = cls(version=1)
        wanted = {
            "pids": {"pids.max": max_procs},
            "memory": {"memory.limit_in_bytes": memory_bytes},
        }
        for mount, fstype, options in _mounts():
            for controller, files in wanted.items():
                if fstype != "cgroup" or controller not in options or controller not in own:
                    continue
                path = Path(mount + own[controller]) / name
                if not group._make(path, files):
                    group.remove()
                    return None
                if controller == "memory":
                    group.memory_dir = path
                elif controller == "pids":
                    group.pids_dir = path
        return group if group.dirs else None

    def _make(self, path: Path, files: dict[str, int]) -> bool:
        try:
            path.mkdir()
        except OSError:
            return False
        self.dirs.append(path)
        return all(_write(path / key, str(value)) for key, value in files.items())

    def enter_tree(self, root: int) -> None:
        """Move `root` and every descendant in, until a look finds no process not yet moved.

        A process forked after its parent moved starts in the group, but one forked between
        our look at the tree and its parent's move stays outside, and so would everything it
        forks. So look again after each move: once a look finds nothing new, every process
        of the tree is in, and all their later forks are born in."""
        moved: set[int] = set()
        while new := [pid for pid in tree_pids(root) if pid not in moved]:
            for procs in self.procs_files:
                for pid in new:
                    with contextlib.suppress(ProcessLookupError):  # ended: nothing to count
                        Path(procs).write_text(str(pid))
            moved.update(new)

    def oom_killed(self) -> bool:
        """Did the kernel's OOM killer act inside this group?"""
        if self.memory_dir is None:
            return False
        events = self.memory_dir / ("memory.events" if self.version == 2 else "memory.oom_control")
        return _counted(events, "oom_kill")

    def refused_forks(self) -> bool:
        """Did the group's process limit (`pids.max`) refuse a fork or a thread?"""
        return self.pids_dir is not None and _counted(self.pids_dir / "pids.events", "max")

    def kill(self) -> None:
        for path in self.dirs:
            if self.version == 2 and _write(path / "cgroup.kill", "1"):
                continue
            for pid in _read(path / "cgroup.procs").split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)

    def remove(self) -> None:
        """Remove the group once its processes are gone (zombies linger a moment)."""
        for path in self.dirs:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    self.kill()
                    time.sleep(0.02)
        self.dirs = []


def _counted(events: Path, name: str) -> bool:
    """Whether the "name count" lines of a cgroup events file count `name` at least once."""
    for line in _read(events).splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip() not in ("", "0"):
            return True
    return False


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
