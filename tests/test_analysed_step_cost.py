"""The set-ups' cost of the report's own optimizer is read from the memory pass's tracked
step (`independent.analysed_step_cost`), not made again by a fake step of its own: the
same figures, and one fake optimizer step fewer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import inspector.memory.independent as independent
from inspector.analyze import inspect_model
from inspector.context import Options
from inspector.memory import setups

HERE = Path(__file__)
SPEC = '{"x": {"shape": ["B", 16]}, "dims": {"B": 4}}'


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(16, 64)
        self.out = nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.wide(x)))


class UnusedLargest(TwoLayers):
    """Its largest weight gets no gradient: the tracked step skips it, a fake step with
    a gradient for every weight does not."""

    def __init__(self) -> None:
        super().__init__()
        self.spare = nn.Linear(64, 64)


def _memory(monkeypatch: pytest.MonkeyPatch, model: str, optimizer: str, read: bool) -> tuple:
    """The memory section and the optimizers `setups.step_cost` ran for; `read` False: every
    step cost made by a fake step, as before."""
    made: list[str] = []
    step_cost = setups.step_cost

    def recorded(name, params, fake_mode, shorten=True):  # noqa: ANN001, ANN202
        made.append(name)
        return step_cost(name, params, fake_mode, shorten)

    monkeypatch.setattr(setups, "step_cost", recorded)
    if not read:
        monkeypatch.setattr(independent, "analysed_step_cost", lambda a: {})
    options = Options(passes={"graph", "memory"}, isolate=False, measure=False)
    options.optimizer = optimizer
    report = inspect_model(f"{HERE}:{model}", SPEC, options)
    monkeypatch.undo()
    return report.memory, made


@pytest.mark.parametrize("optimizer", ["adamw", "momentum", "sgd"])
def test_the_reports_optimizer_is_read_from_the_analysis(monkeypatch, optimizer: str) -> None:
    read, made = _memory(monkeypatch, "TwoLayers", optimizer, read=True)
    before, made_before = _memory(monkeypatch, "TwoLayers", optimizer, read=False)
    assert read.model_dump() == before.model_dump()
    assert sorted(made_before) == ["adamw", "momentum", "sgd"]
    assert optimizer not in made and sorted([*made, optimizer]) == made_before


def test_adamws_step_cost_by_hand(monkeypatch) -> None:
    """AdamW's state: two moments per weight and a 4-byte step counter for each of the four
    tensors; its step peaks with the weights, the [4, 16] input, the gradients, the state
    and the widest weight's two denominators (`sqrt`, then the division: 64 x 16 float32
    values each): above the forward and backward's peak for so small a batch."""
    memory, _ = _memory(monkeypatch, "TwoLayers", "adamw", read=True)
    weights = (16 * 64 + 64 + 64 * 2 + 2) * 4
    [row] = [r for r in memory.setups if r.measured and not r.checkpointing]
    assert row.optimizer_bytes == 2 * weights + 4 * 4
    resident = weights + 4 * 16 * 4
    assert row.train_peak_bytes == resident + weights + row.optimizer_bytes + 2 * 64 * 16 * 4
    [plain] = [r for r in memory.setups if r.optimizer == "sgd" and r.activation_dtype == "float32"]
    assert plain.optimizer_bytes == 0


def test_a_step_that_skipped_a_weight_is_not_read(monkeypatch) -> None:
    """The unused weight has no gradient in the tracked step, which skips it: its figure is
    not the step cost's, which is made by a fake step as before."""
    read, made = _memory(monkeypatch, "UnusedLargest", "adamw", read=True)
    before, _ = _memory(monkeypatch, "UnusedLargest", "adamw", read=False)
    assert "adamw" in made
    assert read.model_dump() == before.model_dump()
