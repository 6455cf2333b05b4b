"""The memory pass flushes denormal floats while it runs, and leaves the setting as it
found it (inspector/memory/denormals.py)."""

from __future__ import annotations

import pytest
import torch
from models import make_mlp

import inspector.passes.memory as memory_pass
from inspector.context import Options
from inspector.health.adhoc import context_for
from inspector.memory.denormals import denormals_flushed, flushing

TINY = 1e-39  # a float32 denormal: 2**-126 is the smallest normal, about 1.18e-38


def test_a_denormal_is_kept_unless_flushed() -> None:
    assert not flushing()
    assert (torch.tensor([TINY]) * 1.0).item() == pytest.approx(TINY, rel=1e-3)
    with denormals_flushed():
        assert flushing()
        assert (torch.tensor([TINY]) * 1.0).item() == 0.0
    assert not flushing()


def test_a_setting_made_before_is_kept() -> None:
    torch.set_flush_denormal(True)
    try:
        with denormals_flushed():
            assert flushing()
        assert flushing()  # the user's own setting, as it was
    finally:
        torch.set_flush_denormal(False)
    assert not flushing()


def test_the_memory_pass_flushes_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    analyse = memory_pass.analyse

    def watched(ctx):  # noqa: ANN001, ANN202
        seen.append(flushing())
        return analyse(ctx)

    monkeypatch.setattr(memory_pass, "analyse", watched)
    model, (args, _) = make_mlp(batch=4)
    ctx = context_for(model, args, options=Options(passes={"memory"}))
    memory_pass.run(ctx)
    assert seen == [True]
    assert ctx.results.memory is not None
    assert not flushing()  # the passes after it read values: as it found it
