"""What checkpointing a block can free at most (`checkpoint_bound`), and the memory pass
making no run for a block that could not reach the advice's share of the peak: the same
section, fewer fake steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import inspector.memory.independent as independent
from inspector.analyze import inspect_model
from inspector.context import Options
from inspector.memory import advice

HERE = Path(__file__)
WIDTH, BATCH = 64, 2
BOUND = advice.checkpoint_bound  # the real one: a test below replaces it
SPEC = f'{{"x": {{"shape": ["B", {WIDTH}]}}, "dims": {{"B": {BATCH}}}}}'


class Block(nn.Module):
    """Two linear layers around an activation the block calls but does not own (it is
    registered on the model): the activation's saves are labelled with its own path,
    outside the block, yet they run under the block's call, and checkpointing the block
    frees them."""

    def __init__(self, shared: nn.Module) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)
        self.shared = [shared]  # a plain list: not a child of the block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.shared[0](self.up(x)))


class SharedActivation(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.GELU()
        self.blocks = nn.Sequential(*(Block(self.act) for _ in range(3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class HeavyHead(SharedActivation):
    """The same blocks before a large head: the weights, gradients and AdamW's state make
    the peak, and no block's activations come near 1% of it."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(WIDTH, 16384)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(super().forward(x))


def _checkpoint_runs(monkeypatch: pytest.MonkeyPatch, model: str, every_group: bool) -> tuple:
    """The report's memory section, and (block, measured saving, bound) for each
    checkpoint run made ("": every block at once); `every_group`: every run, whatever its
    bound."""
    made: list[tuple[str, int, int]] = []
    checked = independent._checked

    def recorded(a, paths, on):  # noqa: ANN001, ANN202
        result = checked(a, paths, on)
        made.append((on, result.saving_bytes, BOUND(a.train, paths)))  # on "": every block
        return result

    monkeypatch.setattr(independent, "_checked", recorded)
    if every_group:
        monkeypatch.setattr(advice, "checkpoint_bound", lambda train, paths: 1 << 62)
    options = Options(passes={"graph", "memory"}, isolate=False, measure=False)
    report = inspect_model(f"{HERE}:{model}", SPEC, options)
    monkeypatch.undo()
    return report.memory, made


def test_the_bound_counts_every_save_under_the_blocks_call(monkeypatch) -> None:
    """Under each block's call: `up` saves the block's input [B, W], the shared GELU (by
    its path outside the block) saves `up`'s output [B, 2W], `down` saves the GELU's
    output [B, 2W]. The checkpointed block keeps its input and frees the other two; the
    three blocks at once keep their three inputs."""
    _, made = _checkpoint_runs(monkeypatch, "SharedActivation", every_group=True)
    groups = [run for run in made if run[0]]
    assert groups, "no checkpoint run was made"
    row = BATCH * WIDTH * 4  # bytes of a [B, W] float32 storage
    for block, saving, bound in groups:
        assert bound == row + 2 * row + 2 * row, block
        assert saving == 2 * row + 2 * row, block
        # what the block's own modules saved (`up`, `down`: 3 rows) is not a bound
        assert saving > row + 2 * row
    [(_, saving, bound)] = [run for run in made if not run[0]]
    assert (saving, bound) == (3 * 4 * row, 3 * 5 * row)


def test_blocks_that_cannot_reach_the_share_get_no_run(monkeypatch) -> None:
    """Under the large head, no block's bound, nor all of theirs, reaches 1% of the peak:
    no checkpoint run, and the section is the one the runs would have given (none of
    their advice is shown, nor the set-ups' checkpointed rows)."""
    fewer, made = _checkpoint_runs(monkeypatch, "HeavyHead", every_group=False)
    every, made_all = _checkpoint_runs(monkeypatch, "HeavyHead", every_group=True)
    least = advice.meaningful_bytes(every.train_peak_bytes)
    assert made_all and all(bound < least for _, _, bound in made_all)
    assert made == []
    assert fewer.model_dump() == every.model_dump()
    assert not [a for a in fewer.advice if a.kind.startswith("checkpoint")]
    assert not [row for row in fewer.setups if row.checkpointing]
