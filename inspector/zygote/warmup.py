"""Pre-import what a first analysis imports, without running torch in the zygote.

A first `inspect_model` spends most of its time importing (fx, export, the profiler,
dynamo...). The zygote forks a throwaway child that analyses a built-in MLP and reports
the modules it imported; the zygote then imports them itself. Imports only: no tensor op
runs in the zygote, so no OpenMP or profiler thread exists when it forks jobs; and the
pure-Python caches a job would otherwise fill again each time (`warm_caches`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

__all__ = ["learned_imports", "import_all", "warm_caches", "WARMUP_MODEL"]

WARMUP_MODEL = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.body(x)


def example_inputs():
    return (torch.randn(2, 16),)
"""
WARMUP_TIMEOUT_S = 300


def _analyse_and_list(folder: Path) -> list[str]:
    from inspector.analyze import inspect_model
    from inspector.context import Options

    before = set(sys.modules)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "zygote_warmup_model.py").write_text(WARMUP_MODEL, encoding="utf-8")
    inspect_model(f"{folder}/zygote_warmup_model.py:Net", None, Options(device="cpu"))
    return sorted(m for m in set(sys.modules) - before if "zygote_warmup" not in m)


def learned_imports(folder: Path) -> list[str]:
    """Module names a first analysis imports, learned in a forked child ([] on failure)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the throwaway child: may start threads, it never forks again
        os.close(read)
        code = 1
        try:
            os.write(write, json.dumps(_analyse_and_list(folder)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    data = _read_all(read, time.monotonic() + WARMUP_TIMEOUT_S, pid)
    _, status = os.waitpid(pid, 0)
    try:
        names = json.loads(data) if os.waitstatus_to_exitcode(status) == 0 else []
    except ValueError:
        names = []
    return [n for n in names if isinstance(n, str)]


def _read_all(fd: int, deadline: float, pid: int) -> bytes:
    import select

    chunks = []
    with os.fdopen(fd, "rb") as f:
        while True:
            if not select.select([f], [], [], max(deadline - time.monotonic(), 0))[0]:
                os.kill(pid, signal.SIGKILL)  # a stuck warm-up costs only its own time
                return b""
            chunk = f.read1(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def import_all(names: list[str]) -> int:
    """Import each of `names`; the count that imported."""
    import importlib

    done = 0
    for name in names:
        try:
            importlib.import_module(name)
            done += 1
        except Exception:  # noqa: BLE001 - a module that only imports in context: skip it
            continue
    return done


def warm_caches() -> int:
    """Fill what Dynamo reads afresh in each job: it names the function at every line it
    traces by tokenizing the whole file the line is in, once per process
    (torch/_dynamo/funcname_cache.py). Each compile check tokenized torch.nn's module
    files again (ResNet-18: conv, batchnorm, activation, pooling and linear, 0.06 s of a
    0.6 s check); read here once, forked jobs inherit them. Pure Python, no thread. The
    count of files read (0 where this torch has no such cache)."""
    try:
        import torch.nn.modules
        from torch._dynamo import funcname_cache
    except Exception:  # noqa: BLE001 - a torch without Dynamo or without this cache
        return 0
    folder = Path(torch.nn.modules.__file__).parent
    files = sorted(str(path) for path in folder.glob("*.py"))
    for name in files:
        try:
            funcname_cache.get_funcname(name, 1)
        except Exception:  # noqa: BLE001 - a private cache that changed: not ours to fix
            return 0
    return len(files)
