"""The training step's optimizer, warmed up and stepped over the parameters that decide its
bytes (inspector/memory/kinds.py): the same figures as over every parameter."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import astuple

import pytest
import torch
from torch import nn

from inspector.context import Inputs
from inspector.fakevalues import new_fake_mode
from inspector.memory import kinds, step
from inspector.memory.optimizer import make_optimizer
from inspector.memory.shadow import fake_shadow
from inspector.memory.step import StepOptions, train_step, warm_up


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(16), nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


def _stack(blocks: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[_Block() for _ in range(blocks)])


def _figures(result: step.TrainResult) -> tuple:
    """Everything a TrainResult says, storage keys (object ids) aside."""
    return (
        result.param_bytes, result.buffer_bytes, result.input_bytes, result.optimizer_bytes,
        result.grad_bytes, result.saved_bytes, result.peak_bytes, result.peak_label,
        result.peak_phase, result.phase_peaks, [astuple(p) for p in result.points],
        result.windows, sorted(result.module_output_bytes.items()), result.unmodelled,
    )  # fmt: skip


def _step(model: nn.Module, fake: bool, optimizer: str) -> step.TrainResult:
    x = torch.randn(4, 16)
    if not fake:
        return train_step(model, Inputs(args=(x,)), StepOptions(optimizer=optimizer))
    mode = new_fake_mode()
    shadow = fake_shadow(model, mode)
    with mode:
        fx = mode.from_tensor(x)
    return train_step(shadow, Inputs(args=(fx,)), StepOptions(optimizer=optimizer, fake_mode=mode))


def _spy_on_stepping(monkeypatch) -> list[int]:
    """The number of parameters each narrowed `optimizer.step()` runs over, as they run."""
    lengths: list[int] = []
    narrowing = kinds.stepping

    @contextmanager
    def spied(opt, params):  # noqa: ANN001, ANN202
        with narrowing(opt, params) as stepped:
            lengths.append(len(opt.param_groups[0]["params"]))
            yield stepped

    monkeypatch.setattr(step, "stepping", spied)
    return lengths


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adamw"])
@pytest.mark.parametrize("fake", [True, False], ids=["fake", "real"])
def test_a_step_over_the_deciding_parameters_is_the_step_over_all(
    monkeypatch, optimizer: str, fake: bool
) -> None:
    lengths = _spy_on_stepping(monkeypatch)
    short = _step(_stack(50), fake, optimizer)
    # the warm-up and the step ran over the first block: its kinds are (16,) twice, then
    # (32, 16), (32,), (16, 32) and (16,), which holds every neighbouring pair of the stack
    assert lengths == [6, 6]
    monkeypatch.setattr(step, "stepping", lambda opt, params: nullcontext(list(params)))
    full = _step(_stack(50), fake, optimizer)
    assert _figures(short) == _figures(full)
    # by hand: 50 blocks of 16 + 16 + 16*32 + 32 + 32*16 + 16 elements in 6 tensors
    numel = 50 * (16 + 16 + 16 * 32 + 32 + 32 * 16 + 16)
    copies = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}[optimizer]
    scalars = 4 * 300 if optimizer.startswith("adam") else 0  # a float32 step per tensor
    assert full.optimizer_bytes == 4 * copies * numel + scalars
    assert full.grad_bytes == 4 * numel


@pytest.mark.parametrize("optimizer", ["momentum", "adamw"])
def test_a_head_after_the_blocks_adds_a_few_parameters_not_all(monkeypatch, optimizer) -> None:
    """A pair of kinds found only at the end (the head after 50 blocks) is reached from the
    first block through the last one: 6 + 1 + 2 parameters, not all 302."""

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(_stack(50), nn.Linear(16, 3))

    lengths = _spy_on_stepping(monkeypatch)
    short = _step(model(), True, optimizer)
    # the walk: the first block (norm 16, 16; fc1 32x16, 32; fc2 16x32, 16), then the last
    # block's fc2 bias (16 after 16 is a pair of neighbours) and the head (3x16, 3)
    assert lengths == [9, 9]
    monkeypatch.setattr(step, "stepping", lambda opt, params: nullcontext(list(params)))
    assert _figures(short) == _figures(_step(model(), True, optimizer))


def test_the_state_copied_by_kind_is_what_a_step_makes() -> None:
    """Each parameter the step did not reach gets its own state tensors, shaped as its own
    step would make them, the fake step counter keeping its value."""
    mode = new_fake_mode()
    shadow = fake_shadow(_stack(20), mode)
    params = list(shadow.parameters())
    with mode:
        short, full = make_optimizer("adamw", params), make_optimizer("adamw", params)
        warm_up(short, params)
        warm_up(full, params, shorten=False)
        for p in params:
            mine, theirs = short.state[p], full.state[p]
            assert mine.keys() == theirs.keys() == {"step", "exp_avg", "exp_avg_sq"}
            for name in mine:
                a, b = mine[name], theirs[name]
                assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
            assert mine["step"].item() == theirs["step"].item() == 1.0
        storages = {t.untyped_storage()._cdata for s in short.state.values() for t in s.values()}
        assert len(storages) == 3 * len(params)  # nothing shared between parameters
        assert all(p.grad is None for p in params)


def test_a_batched_step_is_not_narrowed(monkeypatch) -> None:
    """foreach and fused steps allocate for all parameters at once."""
    params = list(_stack(10).parameters())
    assert len(kinds.deciding(params)) == 6
    monkeypatch.setattr(kinds, "looped", lambda params: False)
    assert len(kinds.deciding(params)) == len(params) == 60


def test_the_walk_takes_every_pair_of_neighbours_and_no_other() -> None:
    """On lists of kinds drawn at random: the walk starts at the first, rises, and the
    pairs of its neighbours are exactly the pairs of neighbours of the whole list."""
    import random

    draw = random.Random(0)
    for _ in range(2000):
        letters = "ABCDE"[: draw.randint(1, 5)]
        kind_list = [draw.choice(letters) for _ in range(draw.randint(1, 40))]
        walk = kinds.pairs_walk(kind_list)
        assert walk[0] == 0 and walk == sorted(set(walk))
        walked = {(kind_list[a], kind_list[b]) for a, b in zip(walk, walk[1:], strict=False)}
        assert walked == set(zip(kind_list, kind_list[1:], strict=False))
    # by hand: 100 blocks of A B B B C D, then a head H h. The first block and the next A
    # (0-6) take every pair but D -> H and H -> h; D -> H is reached from that A through
    # the last block's B C D (A -> B is a pair, A -> C or A -> D is not): 597-599, 600, 601
    walk = kinds.pairs_walk([*"ABBBCD" * 100, "H", "h"])
    assert walk == [0, 1, 2, 3, 4, 5, 6, 597, 598, 599, 600, 601]
