"""Numeric health: per-node statistics against hand-computed values."""

from __future__ import annotations

import pytest
import torch
from test_rules import Two
from torch import nn

from inspector.context import Options
from inspector.health.adhoc import context_for
from inspector.health.stats import dead_fraction, tensor_stats
from inspector.passes import numerics


def run(model: nn.Module, *args, **kw):
    ctx = context_for(model, args, **kw)
    numerics.run(ctx)
    return ctx


class Shift(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x - 1.0)


def test_node_stats_by_hand() -> None:
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, -1.0, 1.0]])
    ctx = run(Shift(), x)
    stats = {n.name: n.stats for n in ctx.report.nodes if n.stats is not None}
    # relu(x - 1) = [[0, 0, 1, 2], [3, 4, 0, 0]]: 4 zeros of 8, mean 10/8
    relu = stats["relu"]
    assert (relu.min, relu.max, relu.zero_fraction) == (0.0, 4.0, 0.5)
    assert relu.mean == pytest.approx(1.25)
    # population std: sqrt(mean(v^2) - mean^2) = sqrt(30/8 - 1.25^2)
    assert relu.std == pytest.approx((30 / 8 - 1.25**2) ** 0.5)
    assert relu.nan_count == relu.inf_count == relu.fp16_overflow_count == 0
    assert stats["sub"].min == -2.0 and stats["x"].max == 5.0


def test_dead_features() -> None:
    # (B=8, F=3): feature 1 is zero for every sample -> 1 of 3 dead
    x = torch.ones(8, 3)
    x[:, 1] = 0
    assert dead_fraction(x) == pytest.approx(1 / 3)
    # (B, C, H, W): channels are dim 1; channel 0 of 2 dead
    img = torch.ones(2, 2, 4, 4)
    img[:, 0] = 0
    assert dead_fraction(img) == pytest.approx(0.5)
    # (B, S, F) sequences: features are the last dim
    seq = torch.ones(2, 4, 5)
    seq[..., :2] = 0
    assert dead_fraction(seq) == pytest.approx(2 / 5)
    assert dead_fraction(torch.zeros(2, 3)) is None  # 2 samples < 8: no verdict


def test_relu_dead_fraction_in_pass() -> None:
    ctx = run(Two("dead"), torch.randn(16, 4))
    relu = next(n.stats for n in ctx.report.nodes if n.name == "relu")
    assert relu.dead_fraction == 1.0  # relu(h - 100) is zero everywhere


def test_saturation() -> None:
    stats = tensor_stats(torch.tensor([0.0, 0.0005, 0.5, 0.9995, 1.0]), "sigmoid")
    assert stats.saturated_fraction == pytest.approx(4 / 5)  # all but 0.5 within 1e-3
    stats = tensor_stats(torch.tensor([-1.0, 0.0, 0.9999, 0.5]), "tanh")
    assert stats.saturated_fraction == pytest.approx(2 / 4)


def test_nan_inf_counts_and_first_nan_node() -> None:
    ctx = run(Two("nan-forward"), torch.randn(3, 4))
    result = ctx.results.numerics
    # log(h - h - 1) = log(-1) = NaN for all 3 x 4 values
    assert result.first_nan_node == "log"
    log = next(n.stats for n in ctx.report.nodes if n.name == "log")
    assert (log.nan_count, log.inf_count, log.min) == (12, 0, None)
    stats = tensor_stats(torch.tensor([1.0, float("inf"), float("-inf"), float("nan"), 3.0]))
    assert (stats.nan_count, stats.inf_count, stats.min, stats.max) == (1, 2, 1.0, 3.0)


def test_fp16_overflow_ignores_mask_constants() -> None:
    big = torch.tensor([70000.0, -1e5, 100.0, torch.finfo(torch.float32).min])
    stats = tensor_stats(big)
    assert stats.fp16_overflow_count == 2  # 70000 and -1e5; finfo.min is a mask
    assert stats.mean == pytest.approx((70000 - 1e5 + 100) / 3)  # mask left out


def test_bf16_error() -> None:
    # bf16 has 8 significant bits: around 1e4 its spacing is 64, so unit noise is lost
    offset = tensor_stats(torch.randn(1000, generator=torch.Generator().manual_seed(0)) + 1e4)
    assert offset.bf16_error > 5
    plain = tensor_stats(torch.randn(1000, generator=torch.Generator().manual_seed(0)))
    assert plain.bf16_error < 0.01  # relative rounding ~2^-9


def test_graphless_models_get_module_stats() -> None:
    from models import make_data_dependent

    model, (args, _) = make_data_dependent()
    ctx = run(model, *args)
    assert ctx.capture.method == "hooks"
    a = next(n for n in ctx.report.nodes if n.name == "a")
    assert a.stats.mean == pytest.approx(model.a(args[0]).mean().item(), rel=1e-5)


def test_fake_mode_skips_with_a_note() -> None:
    ctx = run(Shift(), torch.randn(2, 2), options=Options(fake=True))
    assert all(n.stats is None for n in ctx.report.nodes)
    assert any("fake" in w for w in ctx.report.meta.warnings)
