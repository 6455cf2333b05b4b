"""What the zygote reads once for its jobs besides imports (inspector/zygote/warmup.py)."""

from __future__ import annotations

import inspect
import os
import threading

import pytest
import torch
from torch import nn

from inspector.zygote.warmup import warm_caches

funcname_cache = pytest.importorskip("torch._dynamo.funcname_cache")


def test_dynamo_finds_torch_nn_function_names_already_read() -> None:
    tasks, threads = len(os.listdir("/proc/self/task")), threading.active_count()
    count = warm_caches()
    folder = os.path.dirname(nn.modules.__file__)
    assert count == len([f for f in os.listdir(folder) if f.endswith(".py")])
    conv = inspect.getsourcefile(nn.Conv2d)
    assert conv in funcname_cache.cache  # read: Dynamo will not tokenize it again
    lines, first = inspect.getsourcelines(nn.Conv2d.forward)
    # the name Dynamo's own reading gives (it keeps the names of the blocks before)
    assert funcname_cache.get_funcname(conv, first + len(lines) - 1).endswith("Conv2d.forward")
    # pure Python: the zygote may still fork after it. No thread more; one fewer is an
    # earlier test's, ending meanwhile (CI once counted 10 tasks after 11)
    assert len(os.listdir("/proc/self/task")) <= tasks and threading.active_count() <= threads


def test_a_compile_check_after_it_reads_only_the_users_file(tmp_path) -> None:
    warm_caches()
    read: list[str] = []
    original = funcname_cache._add_file

    def counted(filename: str) -> None:
        read.append(filename)
        original(filename)

    funcname_cache._add_file = counted
    try:
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        torch._dynamo.reset()
        torch.compile(model, backend="eager")(torch.randn(2, 3, 8, 8))
    finally:
        funcname_cache._add_file = original
        torch._dynamo.reset()
    torch_files = [f for f in read if f.startswith(os.path.dirname(nn.modules.__file__))]
    assert torch_files == []
