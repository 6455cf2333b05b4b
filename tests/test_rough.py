"""The bounds that size the passes beside the others before the memory pass has run
(inspector/memory/rough.py): worked out by hand on an MLP, and never below the memory
pass's estimate on the kinds of model users bring."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from graph_helpers import inspect_ctx, make_ctx
from torch import nn

from inspector.memory.rough import step_bytes
from inspector.passes import memory
from inspector.realcost import fake_step_is_cheaper

F32 = 4


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(100, 64)
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 100)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        y, _ = self.attn(x, x, x)
        return self.head(self.norm(x + y))


class _CrossAttention(nn.Module):
    """Queries from a short sequence, keys and values from a longer one (sequence first),
    the weights averaged over the heads returned too."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn = nn.MultiheadAttention(32, 2, dropout=0.1)
        self.head = nn.Linear(32, 3)

    def forward(self, query: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        y, weights = self.attn(query, memory, memory)
        return self.head(y).sum() + weights.sum()


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(32, 64, num_layers=2, batch_first=True)
        self.head = nn.Linear(64, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def _after_graph(build, make):  # noqa: ANN001, ANN202
    ctx = make_ctx(build, lambda **_: make())
    inspect_ctx(ctx)
    return ctx


def test_the_mlp_bounds_by_hand() -> None:
    ctx = _after_graph(_mlp, lambda: ((torch.randn(64, 784),), {}))
    params = 784 * 256 + 256 + 256 * 10 + 10
    weights, inputs = params * F32, 64 * 784 * F32
    # each node's output: the input's placeholder, fc, relu, fc
    activations = inputs + (64 * 256 + 64 * 256 + 64 * 10) * F32
    adamw = 2 * params * F32 + 4 * F32  # exp_avg, exp_avg_sq; a step scalar per tensor
    bounds = step_bytes(ctx)
    assert ctx.report.totals.output_bytes == activations
    assert bounds.forward_peak == weights + inputs + activations
    assert bounds.saved == inputs + 3 * activations
    assert bounds.train_peak == weights + 3 * weights + adamw + bounds.saved + activations


class _HandAttention(nn.Module):
    """Attention written out, so the graph has a node for the scores and the softmax."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(100, 64)
        self.qkv = nn.Linear(64, 192)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 100)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(1, 2) / 8.0, dim=-1)
        return self.head(self.norm(x + weights @ v))


@pytest.mark.parametrize(
    "build, make",
    [
        (_mlp, lambda: ((torch.randn(64, 784),), {})),
        (_cnn, lambda: ((torch.randn(8, 3, 32, 32),), {})),
        (_HandAttention, lambda: ((torch.randint(0, 100, (4, 256)),), {})),
        (_Attention, lambda: ((torch.randint(0, 100, (4, 256)),), {})),
        (_CrossAttention, lambda: ((torch.randn(16, 4, 32), torch.randn(200, 4, 32)), {})),
    ],
    ids=["mlp", "cnn", "attention", "multihead-attention", "cross-attention"],
)
def test_the_bounds_are_never_below_the_memory_estimate(build, make) -> None:  # noqa: ANN001
    ctx = _after_graph(build, make)
    bounds = step_bytes(ctx)
    memory.run(ctx)
    estimate = step_bytes(ctx)  # now the memory pass's own figures
    mem = ctx.report.memory
    assert estimate.train_peak == mem.train_peak_bytes
    assert estimate.forward_peak == mem.forward_peak_bytes
    assert estimate.saved == mem.saved_activation_bytes
    assert bounds.forward_peak >= estimate.forward_peak
    assert bounds.saved >= estimate.saved
    assert bounds.train_peak >= estimate.train_peak


def test_multihead_attention_is_bounded_inside_by_hand() -> None:
    """Kept whole, nn.MultiheadAttention outputs more inside than its output: 4 x 256
    tokens of width 64, 4 heads. Its bound: the three projections and their copies into
    heads (2 x 3 x 1,024 rows x 64), five times the scores (4 heads x 1,024 queries x 256
    keys each), and three times its output (1,024 x 64), in float32, on top of every
    node's output."""
    ctx = _after_graph(_Attention, lambda: ((torch.randint(0, 100, (4, 256)),), {}))
    rows, width = 4 * 256, 64
    inside = 2 * 3 * rows * width + 5 * 4 * rows * 256 + 3 * rows * width
    params = 100 * 64 + (3 * 64 * 64 + 3 * 64) + (64 * 64 + 64) + 2 * 64 + (64 * 100 + 100)
    inputs = 4 * 256 * 8  # int64 ids
    bounds = step_bytes(ctx)
    assert bounds.forward_peak == params * F32 + inputs + ctx.report.totals.output_bytes + (
        inside * F32
    )


def test_no_bounds_where_a_layer_kept_whole_can_outgrow_its_outputs() -> None:
    """An LSTM saves its gates, which are not nodes: its estimate is above what its
    nodes' outputs would bound."""
    ctx = _after_graph(_Recurrent, lambda: ((torch.randn(4, 20, 32),), {}))
    assert step_bytes(ctx) is None
    memory.run(ctx)
    assert ctx.report.memory.saved_activation_bytes > 3 * ctx.report.totals.output_bytes


def test_no_graph_no_bounds() -> None:
    ctx = make_ctx(_mlp, lambda **_: ((torch.randn(2, 784),), {}))
    assert step_bytes(ctx) is None  # neither an estimate nor a graph to bound it from


def test_before_the_memory_pass_real_runs_are_judged_from_the_graph_pass() -> None:
    """A fake step taken as three of the graph pass's meta forwards, against three of the
    check's real forwards."""

    def ctx(graph: float | None, forward: float | None) -> SimpleNamespace:
        timings = {} if graph is None else {"graph": graph}
        return SimpleNamespace(
            results=SimpleNamespace(real_forward_seconds=forward, memory=None),
            report=SimpleNamespace(meta=SimpleNamespace(timings_s=timings)),
        )

    assert fake_step_is_cheaper(ctx(0.06, 0.3))  # ResNet-18 at batch 8
    assert not fake_step_is_cheaper(ctx(0.29, 0.04))  # a 1,000-layer stack
    assert not fake_step_is_cheaper(ctx(None, 0.3))  # no graph pass yet
    assert not fake_step_is_cheaper(ctx(0.01, None))  # a fake run: no real forward
