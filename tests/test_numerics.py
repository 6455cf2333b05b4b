"""Numeric health: per-node statistics against hand-computed values."""

from __future__ import annotations

import pytest
import torch
from test_rules import Two
from torch import nn
from torchvision.models import squeezenet1_1

from inspector.context import Options
from inspector.health.adhoc import context_for
from inspector.health.stats import dead_fraction, tensor_stats
from inspector.passes import findings, numerics


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
    # (B=32, F=3): feature 1 is zero for every sample -> 1 of 3 dead
    x = torch.ones(32, 3)
    x[:, 1] = 0
    assert dead_fraction(x) == pytest.approx(1 / 3)
    # (B, C, H, W): channels are dim 1 (2 x 4 x 4 = 32 values each); channel 0 of 2 dead
    img = torch.ones(2, 2, 4, 4)
    img[:, 0] = 0
    assert dead_fraction(img) == pytest.approx(0.5)
    # (B, S, F) sequences: features are the last dim
    seq = torch.ones(2, 16, 5)
    seq[..., :2] = 0
    assert dead_fraction(seq) == pytest.approx(2 / 5)
    assert dead_fraction(torch.zeros(31, 3)) is None  # 31 values < 32: no verdict


def test_relu_dead_fraction_in_pass() -> None:
    ctx = run(Two("dead"), torch.randn(32, 4))
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


def _squeeze_activations(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    seen: dict[str, torch.Tensor] = {}
    fire = model.features[9].squeeze_activation
    fire.register_forward_hook(lambda m, i, out: seen.__setitem__("fire9", out.detach()))
    with torch.no_grad():
        model(x)
    return seen


def test_squeezenet_squeeze_units_are_not_called_dead_on_a_small_sample() -> None:
    """issue #16: torchvision SqueezeNet 1.1 at 64 px, batch 2 got `dead-relu` on Fire 9's
    squeeze ReLU. On its 18 values per channel (2 images x 3 x 3) 54% of the units are zero,
    over the 50% line; on 16x the values 46%: the small sample put it over the line, so with
    fewer values than dead_min_samples there is no verdict."""
    torch.manual_seed(0)
    model = squeezenet1_1()
    small = _squeeze_activations(model, torch.randn(2, 3, 64, 64))["fire9"]
    large = _squeeze_activations(model, torch.randn(32, 3, 64, 64))["fire9"]
    assert small[0, 0].numel() * 2 == 18 and dead_fraction(small, 8) > 0.5
    assert dead_fraction(large) < 0.5  # 288 values per channel
    ctx = run(model, torch.randn(2, 3, 64, 64))
    findings.run(ctx)
    assert [f.rule for f in ctx.report.findings if f.rule == "dead-relu"] == []


def test_one_pass_statistics_equal_their_definitions() -> None:
    """tensor_stats derives the underflow count from the zero count and skips the overflow
    pass under FP16_MAX; each figure against its definition, with NaN/Inf dropped."""
    from inspector.health.stats import FP16_MAX, FP16_MIN_NORMAL, tensor_stats

    torch.manual_seed(0)
    x = torch.randn(4000)
    x[:300] = 0.0
    x[300:340] = 1e-6  # float16 subnormal
    x[340:350] = -3e-5
    x[350] = float("nan")
    x[351:353] = float("inf")
    for scale in (1.0, 1e5):  # 1e5: beyond float16, an overflow pass
        t = x * scale
        stats = tensor_stats(t)
        finite = t[torch.isfinite(t)]
        mag = finite.abs()
        nonzero = int((mag > 0).sum())
        tiny = int(((mag > 0) & (mag < FP16_MIN_NORMAL)).sum())
        assert (stats.nan_count, stats.inf_count) == (1, 2)
        assert stats.zero_fraction == pytest.approx(300 / 4000)
        assert stats.fp16_underflow_fraction == tiny / nonzero
        assert stats.fp16_overflow_count == int((mag > FP16_MAX).sum())
        assert (stats.min, stats.max) == (finite.min().item(), finite.max().item())
    assert tensor_stats(x).fp16_underflow_fraction == 50 / (4000 - 300 - 3)
    assert tensor_stats(x * 1e5).fp16_overflow_count > 0


class _ConvNet(nn.Module):
    """Conv, BatchNorm, ReLU, dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.3)
        )
        self.head = nn.Linear(8 * 8 * 8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1))


def test_the_gradients_replay_gives_numerics_its_statistics() -> None:
    """The gradients pass's per-node replay is the forward numerics would run (same seed,
    mode and inputs): numerics takes its statistics and runs no forward of its own, and
    they equal those of numerics' own run."""
    from inspector.passes import gradients

    torch.manual_seed(0)
    model, x = _ConvNet(), torch.randn(4, 3, 8, 8)
    alone = context_for(model, (x,), options=Options(passes={"numerics"}))
    numerics.run(alone)
    shared = context_for(model, (x,), options=Options(passes={"gradients", "numerics"}))
    gradients.run(shared)
    convs: list[int] = []  # the graph replay calls the conv module: count those calls
    model.body[0].register_forward_hook(lambda *args: convs.append(1))
    numerics.run(shared)
    assert convs == []  # no forward: the replay's statistics were taken
    numerics.run(alone)
    assert convs == [1]  # ...where numerics alone runs one
    got = {n.name: n.stats for n in shared.report.nodes}
    want = {n.name: n.stats for n in alone.report.nodes}
    assert got == want and sum(s is not None for s in got.values()) >= 5
    assert shared.results.numerics.computed and shared.results.numerics.method == "graph"


def test_gradient_and_weight_norms_are_summed_in_float64() -> None:
    """`vector_norm` sums a float32 tensor in float32: on 38.6 M values (GPT-2's embedding
    gradient) 0.27% off. The grad and weight norms sum their squares in float64."""
    from inspector.health.backprop import grad_stats
    from inspector.health.stats import float64_norm

    x = torch.randn(3_000_000, generator=torch.Generator().manual_seed(0)) * 1e-3
    exact = torch.linalg.vector_norm(x.double()).item()
    assert float64_norm(x) == pytest.approx(exact, rel=1e-12)
    assert grad_stats(x).norm == pytest.approx(exact, rel=1e-12)
    x[7] = float("nan")  # dropped from the norm, counted apart
    stats = grad_stats(x)
    assert stats.nan_count == 1 and stats.norm == pytest.approx(
        torch.linalg.vector_norm(torch.nan_to_num(x, nan=0.0).double()).item(), rel=1e-12
    )
