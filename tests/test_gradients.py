"""Gradient pass: norms equal torch.autograd's, verdicts, per-node grads, state restored."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from models import make_data_dependent, make_small_cnn
from test_rules import Two, Unused
from torch import nn

from inspector.context import Options
from inspector.health.adhoc import context_for
from inspector.passes import gradients

TESTS = str(Path(__file__).parent)  # the test models live in several files here


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def run(model: nn.Module, *args, **kw):
    ctx = context_for(model, args, user_files=[TESTS], **kw)
    gradients.run(ctx)
    return ctx


def default_loss(out: torch.Tensor) -> torch.Tensor:
    # the documented default for one floating output: a fixed random direction
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(20_161))
    return (out * r).mean()


def test_param_grad_norms_equal_autograd() -> None:
    model, x = mlp(), torch.randn(4, 6)
    section = run(model, x).report.gradients
    params = dict(model.named_parameters())
    expected = torch.autograd.grad(default_loss(model(x)), list(params.values()))
    assert section.computed and section.loss.startswith("sum over the floating outputs")
    for row, grad in zip(section.params, expected, strict=True):
        assert row.grad_norm == pytest.approx(grad.norm().item(), rel=1e-6)
        assert row.weight_norm == pytest.approx(params[row.name].norm().item(), rel=1e-6)
        assert row.ratio == pytest.approx(row.grad_norm / row.weight_norm)
        assert row.zero_fraction == pytest.approx((grad == 0).float().mean().item())
        assert row.verdict == "ok"


def test_user_loss_fn_is_used() -> None:
    model, x = mlp(), torch.randn(4, 6)
    ctx = run(model, x, loss_fn=lambda out, inputs: out[:, 0].sum())
    grad = torch.autograd.grad(model(x)[:, 0].sum(), model[2].bias)[0]
    row = next(r for r in ctx.report.gradients.params if r.name == "2.bias")
    assert ctx.report.gradients.loss == "loss_fn(output, inputs)"
    # d/db of sum(out[:, 0]) = [B, 0, 0] = [4, 0, 0]: norm 4
    assert row.grad_norm == pytest.approx(grad.norm().item()) == pytest.approx(4.0)
    assert row.zero_fraction == pytest.approx(2 / 3)


def test_layers_in_forward_order_and_module_norms() -> None:
    class Reordered(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.last, self.first = nn.Linear(4, 2), nn.Linear(3, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.last(torch.tanh(self.first(x)))

    model = Reordered()
    ctx = run(model, torch.randn(5, 3))
    layers = ctx.report.gradients.layers
    assert [(x.module_path, x.depth_index) for x in layers] == [("first", 0), ("last", 1)]
    rows = {r.name: r.grad_norm for r in ctx.report.gradients.params}
    first = math.hypot(rows["first.weight"], rows["first.bias"])
    assert layers[0].grad_norm == pytest.approx(first)
    assert ctx.report.module("first").grad_norm == pytest.approx(first)
    assert ctx.report.module("").grad_norm == pytest.approx(
        math.sqrt(sum(v**2 for v in rows.values()))
    )


def test_node_grad_norms_equal_autograd_on_fx_graph() -> None:
    model, x = mlp(), torch.randn(4, 6)
    ctx = run(model, x)
    h0 = model[0](x)
    h1 = torch.relu(h0)
    out = model[2](h1)
    g0, g1, g2 = torch.autograd.grad(default_loss(out), [h0, h1, out])
    norms = {n.name: n.grad_norm for n in ctx.report.nodes}
    assert norms["_0"] == pytest.approx(g0.norm().item(), rel=1e-6)
    assert norms["_1"] == pytest.approx(g1.norm().item(), rel=1e-6)
    assert norms["_2"] == pytest.approx(g2.norm().item(), rel=1e-6)
    # d mean(out * r)/d out = r / numel
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(20_161))
    assert norms["_2"] == pytest.approx((r / out.numel()).norm().item(), rel=1e-6)


def test_node_grad_norms_without_graph_use_module_calls() -> None:
    model, (args, _) = make_data_dependent()
    ctx = run(model, *args)
    assert ctx.capture.method == "hooks"
    h = model.a(args[0])
    out = model.b(torch.relu(h) if h.sum() > 0 else h)
    ga, gb = torch.autograd.grad(default_loss(out), [h, out])
    norms = {n.name: n.grad_norm for n in ctx.report.nodes}
    assert norms["a"] == pytest.approx(ga.norm().item(), rel=1e-6)
    assert norms["b"] == pytest.approx(gb.norm().item(), rel=1e-6)


@pytest.mark.parametrize("how", ["detach", "data", "numpy", "int", "nograd"])
def test_cut_paths(how: str) -> None:
    section = run(Two(how), torch.randn(3, 4)).report.gradients
    verdicts = {r.name: r.verdict for r in section.params}
    assert verdicts == {"a.weight": "cut", "a.bias": "cut", "b.weight": "ok", "b.bias": "ok"}
    cut_at = next(r.cut_at for r in section.params if r.name == "a.weight")
    assert "test_rules.py:" in cut_at  # the user's line where the path is cut


def test_cut_names_the_fx_node() -> None:
    section = run(Two("detach"), torch.randn(3, 4)).report.gradients
    assert "graph node `detach`" in section.params[0].cut_at


def test_unused_parameters() -> None:
    section = run(Unused(), torch.randn(3, 4)).report.gradients
    assert {r.name: r.verdict for r in section.params} == {
        "used.weight": "ok", "used.bias": "ok", "spare.weight": "unused", "spare.bias": "unused",
    }  # fmt: skip
    assert [x.verdict for x in section.layers] == ["ok", "unused"]


def test_frozen_parameters_are_not_judged() -> None:
    model = mlp()
    model[0].requires_grad_(False)
    section = run(model, torch.randn(4, 6)).report.gradients
    assert [r.verdict for r in section.params] == ["frozen", "frozen", "ok", "ok"]
    assert [x.module_path for x in section.layers] == ["2"]


def test_vanishing_and_exploding_verdicts() -> None:
    vanish = run(Two("vanish"), torch.randn(3, 4)).report.gradients
    assert [x.verdict for x in vanish.layers] == ["vanishing", "ok"]
    explode = run(Two("explode"), torch.randn(3, 4)).report.gradients
    assert "exploding" in [x.verdict for x in explode.layers]


def test_thresholds_from_options() -> None:
    ctx = run(mlp(), torch.randn(4, 6), options=Options(thresholds={"exploding_norm": 1e-9}))
    section = ctx.report.gradients
    assert section.thresholds["exploding_norm"] == 1e-9
    assert section.thresholds["vanishing_ratio"] == 1e-5  # default kept
    assert {x.verdict for x in section.layers} == {"exploding"}


def test_nan_gradients_and_first_node() -> None:
    section = run(Two("nan"), torch.randn(3, 4)).report.gradients
    rows = {r.name: r for r in section.params}
    assert rows["a.weight"].verdict == "nan" and rows["a.weight"].nan_count > 0
    assert rows["b.weight"].verdict == "ok"
    # sqrt'(0) = inf flows into the gradient of `mul` (h * 0.0) first, in backward order
    assert section.first_nan_node == "mul"


def test_inplace_error_is_explained() -> None:
    ctx = run(Two("inplace"), torch.randn(3, 4))
    section = ctx.report.gradients
    assert not section.computed and section.params == []
    assert "`add_`" in section.error and "test_rules.py:" in section.error
    assert "Sigmoid" in section.error and "Traceback" not in section.error


def test_fake_mode_is_skipped_with_a_note() -> None:
    section = run(mlp(), torch.randn(4, 6), options=Options(fake=True)).report.gradients
    assert not section.computed and "fake" in section.error and section.params == []


def test_model_state_is_restored() -> None:
    model, (args, _) = make_small_cnn()
    model.train()
    model.features[1].eval()
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    flags = [m.training for m in model.modules()]
    rng = torch.get_rng_state()
    run(model, *args)
    assert all(torch.equal(v, buffers[k]) for k, v in model.named_buffers())
    assert [m.training for m in model.modules()] == flags
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_gradients_on_cuda() -> None:
    model, x = mlp().cuda(), torch.randn(4, 6, device="cuda")
    section = run(model, x, options=Options(device="cuda")).report.gradients
    expected = torch.autograd.grad(default_loss(model(x)), list(model.parameters()))
    for row, grad in zip(section.params, expected, strict=True):
        assert row.grad_norm == pytest.approx(grad.norm().item(), rel=1e-5)
