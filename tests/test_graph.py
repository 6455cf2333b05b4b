"""The graph pass: shapes (conv formula), parameters, FLOPs, bytes, symbolic dims, sums."""

from __future__ import annotations

from fractions import Fraction
from functools import cache
from pathlib import Path

import models
import pytest
import torch
from graph_helpers import inspect_ctx, make_ctx, run_model
from torch import nn

from inspector.errors import UserCodeError
from inspector.graph.symdims import format_monomial, monomial
from inspector.report import Report

THIS = str(Path(__file__))
DIMS = {
    "resnet18": {"B": 2},
    "data_dependent": {"B": 4},
    "dict_in_tuple_out": {"B": 4},
    "embedding": {"B": 4, "S": 12},
    "tied": {"B": 2, "S": 6},
    "mlp": {"B": 4},
    "small_cnn": {"B": 4},
    "gpt2": {"B": 2, "S": 8},
    "bert": {"B": 2, "S": 8},
}


@cache
def report_of(name: str, fake: bool = False) -> Report:
    return run_model(name, fake=fake, **DIMS[name])


def conv_out(h: int, k: int, s: int = 1, p: int = 0, d: int = 1) -> int:
    """floor((H + 2p - d(k-1) - 1) / s) + 1"""
    return (h + 2 * p - d * (k - 1) - 1) // s + 1


def test_conv_formula_helper() -> None:
    assert conv_out(64, 7, 2, 3) == 32  # floor((64 + 6 - 6 - 1) / 2) + 1 = floor(63/2) + 1
    assert conv_out(32, 3, 2, 1) == 16  # floor((32 + 2 - 2 - 1) / 2) + 1 = 15 + 1


def test_resnet18_shapes_follow_the_conv_formula_and_show_B() -> None:
    report = report_of("resnet18")
    # conv1: 7x7, stride 2, padding 3 on 64x64: floor((64 + 2*3 - 1*(7-1) - 1)/2) + 1 = 32
    assert report.module("conv1").output_shapes == [["B", 64, 32, 32]]
    # maxpool 3x3, stride 2, padding 1: floor((32 + 2 - 2 - 1)/2) + 1 = 16
    assert report.module("maxpool").output_shapes == [["B", 64, 16, 16]]
    # layer4: three more stride-2 stages: 16 -> 8 -> 4 -> 2
    assert report.module("layer4").output_shapes == [["B", 512, 2, 2]]
    assert report.module("fc").output_shapes == [["B", 1000]]
    assert report.module("").input_shapes == [["B", 3, 64, 64]]
    conv1 = next(n for n in report.nodes if n.target == "conv1")
    out = conv1.output_tensors[0]
    assert out.shape == [2, 64, 32, 32] and out.sym_shape == ["B", 64, 32, 32]
    assert out.bytes == 2 * 64 * 32 * 32 * 4  # numel * itemsize (float32)
    assert conv1.output_bytes == out.bytes
    assert conv1.params == 3 * 64 * 7 * 7  # the conv's weight, no bias
    assert conv1.location == f"models.py:{_line_of(models.__file__, 'x = self.maxpool(')}"


def _line_of(path: str, text: str) -> int:
    lines = Path(path).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_resnet18_params_and_conv_flops() -> None:
    report = report_of("resnet18")
    assert report.totals.params == models.RESNET18_PARAMS == 11_689_512
    assert report.totals.trainable_params == 11_689_512 and report.totals.frozen_params == 0
    # independent count straight from torch
    assert report.totals.params == sum(p.numel() for p in models.ResNet18().parameters())
    conv1 = report.module("conv1")
    # 2 * B * Cout * Hout * Wout * Cin * kh * kw = 2 * 2 * 64 * 32 * 32 * 3 * 7 * 7
    assert conv1.flops_forward == 2 * 2 * 64 * 32 * 32 * 3 * 7 * 7 == 38_535_168
    # fc: Linear(512, 1000): 2 * B * in * out = 2 * 2 * 512 * 1000
    assert report.module("fc").flops_forward == 2_048_000
    assert report.totals.param_bytes == 11_689_512 * 4
    # BatchNorm running_mean + running_var (+ num_batches_tracked, 1 each) per BN layer
    bn_channels = sum(
        m.num_features for m in models.ResNet18().modules() if isinstance(m, nn.BatchNorm2d)
    )
    assert report.totals.buffers == 2 * bn_channels + 20  # 20 BatchNorm layers


class OneConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.lin = nn.Linear(8 * 8 * 8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.conv(x).flatten(1))


@pytest.mark.parametrize("fake", [False, True])
def test_linear_and_conv_flops_by_hand(fake: bool) -> None:
    ctx = make_ctx(
        OneConv,
        lambda B: ((torch.randn(B, 3, 16, 16),), {}),
        {"B": 2},
        fake=fake,
        user_files=(THIS,),
    )
    report = inspect_ctx(ctx)
    conv = report.module("conv")
    # Hout = floor((16 + 2*1 - 1*(3-1) - 1)/2) + 1 = floor(15/2) + 1 = 8
    assert conv.output_shapes == [["B", 8, 8, 8]]
    # 2 * B * Cout * Hout * Wout * Cin * kh * kw = 2 * 2 * 8 * 8 * 8 * 3 * 3 * 3
    assert conv.flops_forward == 55_296
    # Linear: 2 * B * in * out = 2 * 2 * 512 * 5
    assert report.module("lin").flops_forward == 10_240
    assert report.totals.flops_forward == 55_296 + 10_240
    # params: 8*3*3*3 + (512*5 + 5)
    assert report.totals.params == 216 + 2_565
    # backward: the input needs no grad, so conv only has its weight grad (= its forward),
    # lin has weight grad + input grad (2 x its forward): 55_296 + 2 * 10_240
    assert report.totals.flops_backward == 55_296 + 20_480
    assert report.module("conv").flops_backward == 55_296


def test_mlp_flops_and_backward() -> None:
    report = report_of("mlp")
    # 2 * B * (784*512 + 512*256 + 256*10) = 2 * 4 * 535_040
    assert report.totals.flops_forward == 4_280_320
    # weight grads (= forward) + input grads of the 2nd and 3rd Linear: 2 * 4 * (512*256 + 256*10)
    assert report.totals.flops_backward == 4_280_320 + 1_069_056
    assert report.totals.params == (784 * 512 + 512) + (512 * 256 + 256) + (256 * 10 + 10)
    assert not any("2 x forward" in w for w in report.meta.warnings)


@pytest.mark.parametrize("fake", [False, True])
def test_tied_weight_counted_once_and_marked(fake: bool) -> None:
    report = report_of("tied", fake)
    # emb 50*16 = 800 (shared with head), hidden 16*16 + 16 = 272; the head adds nothing
    assert report.totals.params == 800 + 272 == 1_072
    assert report.totals.tied_params == 800
    head = report.module("head")
    assert head.tied_params == ["head.weight"]
    assert head.params == 0 and report.module("emb").params == 800
    assert report.module("").tied_params == []
    # the head still computes: 2 * B * S * 16 * 50 = 2 * 2 * 6 * 800
    assert head.flops_forward == 19_200
    assert head.output_shapes == [["B", "S", 50]]


def _children(report: Report, path: str) -> list:
    return [m for m in report.modules if m.parent == path]


def _own_flops(report: Report, path: str) -> int:
    return sum(n.flops for n in report.nodes if (n.module_path or "") == path)


@pytest.mark.parametrize("name", sorted(DIMS))
def test_module_columns_add_up_to_the_totals(name: str) -> None:
    report = report_of(name)
    root, totals = report.module(""), report.totals
    assert (root.params, root.flops_forward, root.flops_backward, root.output_bytes) == (
        totals.params,
        totals.flops_forward,
        totals.flops_backward,
        totals.output_bytes,
    )
    assert totals.flops_forward > 0
    for m in report.modules:
        kids = _children(report, m.path)
        if not kids:
            continue
        assert m.params == m.own_params + sum(k.params for k in kids), m.path
        assert m.flops_forward == _own_flops(report, m.path) + sum(k.flops_forward for k in kids), (
            m.path
        )
        if m.path:  # the root's backward also holds ops outside every child
            assert m.flops_backward >= sum(k.flops_backward for k in kids), m.path


@pytest.mark.parametrize("name", sorted(DIMS))
def test_real_and_fake_runs_agree_on_every_shape(name: str) -> None:
    real, fake = report_of(name), report_of(name, True)
    assert real.capture.method == fake.capture.method
    shapes = [[t.shape for t in n.output_tensors] for n in real.nodes]
    assert shapes == [[t.shape for t in n.output_tensors] for n in fake.nodes]
    sym = [[t.sym_shape for t in n.output_tensors] for n in real.nodes]
    assert sym == [[t.sym_shape for t in n.output_tensors] for n in fake.nodes]
    assert [m.output_shapes for m in real.modules] == [m.output_shapes for m in fake.modules]
    assert real.totals.params == fake.totals.params
    assert real.totals.flops_forward == fake.totals.flops_forward
    assert real.totals.flops_backward == fake.totals.flops_backward


class Heads(nn.Module):
    """Splits 32 features into 8 heads of 4: with B = 8 the head count equals B."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return self.proj(x).view(b, s, 8, 4).transpose(1, 2)


@pytest.mark.parametrize("fake", [False, True])
def test_a_head_count_equal_to_B_is_not_B(fake: bool) -> None:
    ctx = make_ctx(
        Heads,
        lambda B, S: ((torch.randn(B, S, 32),), {}),
        {"B": 8, "S": 6},
        fake=fake,
        user_files=(THIS,),
    )
    report = inspect_ctx(ctx)
    assert report.module("").output_shapes == [["B", 8, "S", 4]]
    assert report.module("proj").output_shapes == [["B", "S", 32]]


def test_gpt2_symbolic_dims_and_attention_flops() -> None:
    report = report_of("gpt2")
    assert report.module("").output_shapes[0] == ["B", "S", 100]
    # attention: q, k, v [B, heads, S, head_dim]; heads = 4 stays a number
    (sdpa,) = [n for n in report.nodes if "scaled_dot_product" in n.target][:1]
    assert sdpa.output_tensors[0].sym_shape == ["B", 4, "S", 16]
    # q @ k^T and scores @ v: 2 * (2 * B * h * S * S * d) = 2 * 2 * 2 * 4 * 8 * 8 * 16
    assert sdpa.flops == 32_768
    # flattened tokens before the MLP's addmm: B*S rows
    assert any(t.sym_shape == ["B*S", 256] for n in report.nodes for t in n.output_tensors)


def test_monomials() -> None:
    assert monomial(16, {"S": (16, 8, 8)}) == "S"
    assert monomial(32, {"S": (16, 8, 16)}) == "2*S"
    assert monomial(8, {"S": (16, 8, 4)}) == "S/2"
    assert monomial(64, {"B": (4, 2, 32), "S": (16, 8, 32)}) == "B*S"
    assert monomial(256, {"S": (16, 8, 64)}) == "S^2"
    assert monomial(15, {"S": (16, 8, 7)}) == 15  # S - 1: no monomial fits, keep the number
    assert monomial(8, {}) == 8
    assert format_monomial(Fraction(1, 2), {"B": 1, "S": -1}) == "B/(2*S)"


def test_a_dim_whose_perturbed_run_fails_stays_concrete() -> None:
    class EvenOnly(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(x.shape[0] // 4, 4, -1)  # B must be a multiple of 4

    ctx = make_ctx(EvenOnly, lambda B: ((torch.randn(B, 3),), {}), {"B": 4}, user_files=(THIS,))
    report = inspect_ctx(ctx)  # B=4 -> 2 does not run; no error, B stays 4
    assert report.module("").output_shapes == [[1, 4, 3]]
    assert any("B changed" in w for w in report.meta.warnings)


class Mismatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) @ torch.ones(5, 5)  # shapes do not fit


def test_a_graph_that_traces_but_does_not_run_is_a_user_error() -> None:
    ctx = make_ctx(Mismatch, lambda B: ((torch.randn(B, 4),), {}), {"B": 2}, user_files=(THIS,))
    with pytest.raises(UserCodeError) as info:
        inspect_ctx(ctx)
    assert info.value.location == f"test_graph.py:{_line_of(THIS, '@ torch.ones(5, 5)')}"
    assert "matmul" in str(info.value) or "mat1" in str(info.value) or "shape" in str(info.value)


def test_nodes_have_ids_inputs_and_module_types() -> None:
    report = report_of("small_cnn")
    assert [n.id for n in report.nodes] == list(range(len(report.nodes)))
    for n in report.nodes:
        assert all(0 <= i < n.id for i in n.inputs)
    conv = next(n for n in report.nodes if n.target == "features.0")
    assert conv.module_type == "Conv2d" and conv.module_path == "features.0"
    # 2 * B * 16 * 32 * 32 * 3 * 3 * 3 = 2 * 4 * 442_368
    assert conv.flops == 3_538_944
    assert report.module("features").calls == 1 and report.module("features.2").calls == 1


@pytest.mark.slow
def test_gpt2_small_full_config_in_fake_mode() -> None:
    ctx = make_ctx(
        lambda: models.make_gpt2()[0],
        # B = 1: the perturbed run is at B = 2 (export would specialize a size of 1)
        lambda B, S: ((), {"input_ids": torch.randint(0, 50257, (B, S))}),
        {"B": 1, "S": 16},
        fake=True,
    )
    report = inspect_ctx(ctx)
    assert report.capture.method == "fx"  # guided: plain symbolic_trace fails on HF
    assert report.totals.params == models.GPT2_PARAMS == 124_439_808
    assert report.module("lm_head").tied_params == ["lm_head.weight"]
    assert report.totals.tied_params == 50257 * 768  # the token embedding, once
    assert report.module("").output_shapes[0] == ["B", "S", 50257]


@pytest.mark.slow
def test_symbolic_export_and_perturbed_reexports_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two independent ways to name dims: symbols of one symbolic export, and re-exports
    with each dim changed (what a static export needs)."""
    symbolic = run_model("gpt2", B=2, S=8)
    import inspector.capture as capture

    monkeypatch.setattr(capture, "_dynamic_axes", lambda ctx: None)  # static export only
    static = run_model("gpt2", B=2, S=8)
    assert [m.output_shapes for m in symbolic.modules] == [m.output_shapes for m in static.modules]
    assert symbolic.module("transformer.h.0.mlp.c_fc").output_shapes == [["B", "S", 256]]
    assert symbolic.totals.flops_forward == static.totals.flops_forward
