"""Checkpointing advice that holds for the model's own structure: blocks are the UNet's
conv blocks, ResNet's and GPT-2's layers; every advised saving was run on fake tensors;
the advice, the set-ups table and the finding quote one number."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_gradient_verdicts import UNet
from torch import nn
from torch.utils.checkpoint import checkpoint

from inspector.analyze import inspect_model
from inspector.context import Options
from inspector.memory.advice import blocks

HERE = Path(__file__).parent
UNET_SPEC = '{"x": {"shape": ["B", 3, 32, 32]}, "dims": {"B": 4}}'


def test_unet_blocks_are_its_conv_blocks() -> None:
    assert [p for p, _ in blocks(UNet())] == ["enc1", "enc2", "mid", "dec2", "dec1"]


@pytest.fixture(scope="module")
def unet_report():
    options = Options(passes={"graph", "memory", "findings"}, measure=False)
    return inspect_model(f"{HERE / 'test_gradient_verdicts.py'}:UNet", UNET_SPEC, options)


def test_unet_advice_is_verified_and_agrees_everywhere(unet_report) -> None:
    memory = unet_report.memory
    checkpoints = [a for a in memory.advice if a.kind == "checkpoint"]
    assert {a.where for a in checkpoints} <= {"enc1", "enc2", "mid", "dec2", "dec1"}
    assert checkpoints and all(a.verified for a in checkpoints)
    for a in checkpoints:  # the prediction from saved storages ranks; the run decides
        assert a.saving_bytes == pytest.approx(a.predicted_saving_bytes, rel=0.5), a.where
    every = next(a for a in memory.advice if a.kind == "checkpoint-all")
    assert every.verified and every.saving_bytes > max(a.saving_bytes for a in checkpoints)
    row = next(r for r in memory.setups if r.checkpointing and r.optimizer == "adamw"
               and r.activation_dtype == "float32")  # fmt: skip
    # the set-ups table's "every block" row is that same run
    assert row.saved_activation_bytes == memory.saved_activation_bytes - every.saving_bytes
    finding = next(f for f in unet_report.findings if f.rule == "checkpoint-candidate")
    assert finding.severity == "info"
    assert f"frees {_mib(every.saving_bytes)}" in finding.message


class UNetCheckpointed(UNet):
    """The user's own fix: the advised block wrapped in torch.utils.checkpoint."""

    block = "enc1"  # the file is loaded afresh by the inspector: this default is what runs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = getattr(self, self.block)
        wrapped = lambda h: checkpoint(inner, h, use_reentrant=False)  # noqa: E731
        with _swapped(self, self.block, wrapped):
            return super().forward(x)


class _swapped:
    def __init__(self, model: nn.Module, name: str, fn: object) -> None:
        self.model, self.name, self.fn = model, name, fn

    def __enter__(self) -> None:
        self.original = self.model._modules.pop(self.name)
        object.__setattr__(self.model, self.name, self.fn)

    def __exit__(self, *exc: object) -> None:
        object.__delattr__(self.model, self.name)
        self.model._modules[self.name] = self.original


def test_the_advised_saving_is_what_the_users_fix_saves(unet_report) -> None:
    """Independent of the inspector's own wrapping: the model with the block checkpointed
    in its forward saves exactly the advised bytes less."""
    advised = {a.where: a for a in unet_report.memory.advice if a.kind == "checkpoint"}
    best = advised[UNetCheckpointed.block]  # the loaded file's class: its default block
    options = Options(passes={"graph", "memory"}, measure=False)
    fixed = inspect_model(f"{Path(__file__)}:UNetCheckpointed", UNET_SPEC, options)
    saved = unet_report.memory.saved_activation_bytes
    assert saved - fixed.memory.saved_activation_bytes == best.saving_bytes


def test_no_advice_below_a_meaningful_size(unet_report) -> None:
    peak = unet_report.memory.train_peak_bytes
    assert all(a.saving_bytes >= 0.01 * peak for a in unet_report.memory.advice)


def _mib(n: int) -> str:
    from inspector.units import format_bytes

    return format_bytes(n)


def test_the_checks_run_side_by_side_give_the_checks_run_one_by_one(
    unet_report, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The advised checkpointing runs (one per group of blocks, and every block at once)
    are independent fake steps, run in forked children when each is slow (a large model):
    the same advice as in one process. Here forked whatever their time."""
    import inspector.forkmap as forkmap
    import inspector.passes.memory as memory_pass

    options = Options(passes={"graph", "memory", "findings"}, measure=False, isolate=False)
    model = f"{HERE / 'test_gradient_verdicts.py'}:UNet"
    forked: list[int] = []
    start = forkmap._start

    def counted(fn, item):  # noqa: ANN001, ANN202
        forked.append(1)
        return start(fn, item)

    monkeypatch.setattr(forkmap, "_start", counted)
    always = lambda fn, items, _seconds: forkmap.fork_map(fn, items)  # noqa: E731
    monkeypatch.setattr(memory_pass, "fork_map_if_slow", always)
    side_by_side = inspect_model(model, UNET_SPEC, options)
    assert len(forked) >= 2
    monkeypatch.setattr(forkmap, "_may_fork", lambda: False)
    alone = inspect_model(model, UNET_SPEC, options)
    assert len([a for a in alone.memory.advice if a.kind.startswith("checkpoint")]) >= 2
    assert side_by_side.memory.advice == alone.memory.advice == unet_report.memory.advice
    assert side_by_side.memory.setups == alone.memory.setups == unet_report.memory.setups


def test_the_checks_fork_by_what_a_warm_rerun_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forking is decided by the last rerun's seconds (the batch-scaling run, warm), not
    by the first step's, which paid the process's first fake dispatches."""
    import inspector.memory.analysis as analysis
    import inspector.passes.memory as memory_pass

    seen: list[float] = []
    reruns: list[float] = []
    real_rerun = analysis.rerun

    def timed_rerun(a, inputs, **changes):  # noqa: ANN001, ANN202
        result = real_rerun(a, inputs, **changes)
        reruns.append(a.rerun_seconds)
        return result

    def recorded(fn, items, seconds):  # noqa: ANN001, ANN202
        seen.append(seconds)
        return [fn(x) for x in items]

    monkeypatch.setattr(analysis, "rerun", timed_rerun)  # batch scaling's, by batch_runs
    monkeypatch.setattr(memory_pass, "fork_map_if_slow", recorded)
    options = Options(passes={"graph", "memory", "findings"}, measure=False, isolate=False)
    inspect_model(f"{HERE / 'test_gradient_verdicts.py'}:UNet", UNET_SPEC, options)
    # batch scaling (twice the batch) is the one rerun before the checks: its seconds
    assert len(seen) == 1 and len(reruns) == 1
    assert seen[0] == reruns[0] > 0
