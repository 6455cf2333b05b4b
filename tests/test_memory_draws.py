"""A step whose memory depends on its random draws (wav2vec2's layerdrop skips whole
layers): the estimate on a real copy takes the larger of two seeds and says so, and the
report's own measurement takes the estimate's first draws."""

from __future__ import annotations

import torch
from torch import nn

from inspector.context import Options
from inspector.health.adhoc import context_for
from inspector.passes import measure as measure_pass
from inspector.passes import memory as memory_pass
from inspector.rules.memory import memory_estimate_gap

WIDTH, BATCH, LAYERS, RATE = 512, 1024, 6, 0.5


class LayerDrop(nn.Module):
    """Each layer skipped in training when `torch.rand([])` is under the rate, as
    transformers' wav2vec2 does; `bool(draw < rate)` has no value on fake tensors, so
    the estimate runs on a real copy."""

    def __init__(self, rate: float = RATE, dropout: float = 0.0) -> None:
        super().__init__()
        self.rate = rate
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.training and torch.rand([]) < self.rate:
                continue
            x = self.drop(torch.relu(layer(x)))
        return x


def _kept(seed: int) -> int:
    """Layers a step at `seed` runs, drawn by hand the way the forward draws them."""
    torch.manual_seed(seed)
    return sum(not bool(torch.rand([]) < RATE) for _ in range(LAYERS))


def _context(model: nn.Module):  # noqa: ANN202
    torch.manual_seed(0)
    x = torch.randn(BATCH, WIDTH)
    return context_for(model, (x,), options=Options(passes=["memory"]))


def test_the_larger_of_two_draws_is_the_estimate_and_the_difference_is_said() -> None:
    assert (_kept(0), _kept(1)) == (2, 3)  # seed 1 runs one layer more
    ctx = _context(LayerDrop())
    memory_pass.run(ctx)
    measure_pass.run(ctx)
    mem = ctx.report.memory
    assert set(mem.train_peak_by_seed) == {"0", "1"}
    assert mem.train_peak_by_seed["1"] > mem.train_peak_by_seed["0"]
    assert mem.train_peak_bytes == mem.train_peak_by_seed["1"]
    # by hand: the step saves its input and each kept layer's ReLU output, 1024 x 512 x
    # 4 B = 2 MiB each, and peaks as backward starts, with all of them live
    activation = BATCH * WIDTH * 4
    assert mem.saved_activation_bytes == (1 + _kept(1)) * activation == 8 << 20
    assert mem.train_peak_by_seed["1"] - mem.train_peak_by_seed["0"] == activation
    assert any("random draws" in w for w in ctx.report.meta.warnings)
    # the measured step took seed 0's draws: within 2% of that draw's estimate
    measured = mem.measured.train_peak_bytes
    assert abs(measured - mem.train_peak_by_seed["0"]) <= 0.02 * measured
    # the gap to the larger draw is explained as the draws' doing: a note, not a warning
    gaps = list(memory_estimate_gap(ctx, ctx.report))
    assert len(gaps) == 1 and gaps[0].severity == "info"
    assert "random draws" in gaps[0].message


def test_draws_that_change_no_shape_leave_one_estimate() -> None:
    # dropout draws at every step, but no draw decides what runs: the same peak twice
    ctx = _context(LayerDrop(rate=-1.0, dropout=0.1))
    memory_pass.run(ctx)
    assert ctx.report.memory.train_peak_by_seed == {}
    assert not any("random draws" in w for w in ctx.report.meta.warnings)
