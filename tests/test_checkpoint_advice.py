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


def test_the_runs_side_by_side_give_the_runs_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory pass's independent fake runs (the per-node run, twice the batch, the
    advised checkpointing, bf16, the optimizers' steps) give the same section in forked
    children as in this process. Here forked whatever their time."""
    import inspector.forkmap as forkmap

    options = Options(passes={"graph", "memory", "findings"}, isolate=False)
    model = f"{HERE / 'test_gradient_verdicts.py'}:UNet"
    forked: list[int] = []
    outcomes = forkmap._Worker.outcomes

    def counted(worker):  # noqa: ANN001, ANN202 - the runs a forked worker did
        got = outcomes(worker)
        forked.extend(got)
        return got

    monkeypatch.setattr(forkmap._Worker, "outcomes", counted)
    monkeypatch.setattr(forkmap, "FORK_WORTH_SECONDS", 0.0)
    side_by_side = inspect_model(model, UNET_SPEC, options)
    if forkmap._workers(2) >= 2:  # noqa: SLF001 - one core: everything runs here
        # of 6+ (nodes, batch, 3+ checkpoint runs, bf16), those this process did not
        # reach first
        assert len(forked) >= 2
    monkeypatch.setattr(forkmap, "_may_fork", lambda: False)
    alone = inspect_model(model, UNET_SPEC, options)
    assert len([a for a in alone.memory.advice if a.kind.startswith("checkpoint")]) >= 2
    assert side_by_side.memory.measured is not None  # the measure pass, asked with memory
    assert side_by_side.memory.model_dump() == alone.memory.model_dump()
    assert [(n.saved_bytes, n.live_bytes_after) for n in side_by_side.nodes] == [
        (n.saved_bytes, n.live_bytes_after) for n in alone.nodes
    ]
    assert side_by_side.meta.warnings == alone.meta.warnings


@pytest.mark.parametrize("worth", [0.0, 1e9])
def test_what_is_worth_a_fork(monkeypatch: pytest.MonkeyPatch, worth: float) -> None:
    """A fake run is forked where half the first (cold) step's seconds reach a fork's
    worth; the optimizers' steps (one step each) never."""
    import inspector.forkmap as forkmap
    import inspector.memory.independent as independent

    asked: list[list[bool]] = []

    def here(runs):  # noqa: ANN001, ANN202
        asked.append([worth for _, worth in runs])
        return [forkmap._here(fn) for fn, _ in runs]  # noqa: SLF001

    monkeypatch.setattr(independent, "side_by_side", here)
    monkeypatch.setattr(forkmap, "FORK_WORTH_SECONDS", worth)
    options = Options(passes={"graph", "memory"}, isolate=False, measure=False)
    report = inspect_model(f"{HERE / 'test_gradient_verdicts.py'}:UNet", UNET_SPEC, options)
    assert report.memory.batch_scaling and report.memory.advice
    [flags] = asked
    assert len(flags) >= 6  # nodes, batch, the checkpoint runs, bf16, the optimizers' steps
    assert flags[:-1] == [worth == 0.0] * (len(flags) - 1)
    assert flags[-1] is False
