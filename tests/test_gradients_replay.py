"""The gradients pass runs one forward and backward fewer (issue #17): where the captured
fx graph computes the eager forward's loss over the same parameters, its per-node replay
is the backward that fills the parameters' grads; the eager forward still runs, under the
recorders, and no eager backward does. Where the replay computes something else, the
eager backward runs as before."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_rules import Two
from torch import nn

from inspector.health.adhoc import context_for
from inspector.passes import gradients

TESTS = str(Path(__file__).parent)


class Counted(nn.Module):
    """An MLP whose first layer counts the backward passes through it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(6, 5), nn.Linear(5, 3)
        self.backwards = 0
        self.a.register_full_backward_hook(self._count)

    def _count(self, module: nn.Module, grad_in: object, grad_out: object) -> None:
        self.backwards += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)) + 1)


def _default_loss(out: torch.Tensor) -> torch.Tensor:
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(20_161))
    return (out * r).mean()


def test_one_backward_fills_the_param_grads_and_the_node_grads() -> None:
    model, x = Counted(), torch.randn(4, 6)
    ctx = context_for(model, (x,), user_files=[TESTS])
    assert ctx.capture.method == "fx"
    gradients.run(ctx)
    assert model.backwards == 1  # two before: the eager backward, then the replay's
    section = ctx.report.gradients
    # the independent answer: torch.autograd on the eager model
    params = dict(model.named_parameters())
    out = model(x)
    expected = torch.autograd.grad(_default_loss(out), list(params.values()))
    for row, grad in zip(section.params, expected, strict=True):
        assert row.grad_norm == pytest.approx(grad.norm().item(), rel=1e-6), row.name
    assert section.loss_value == pytest.approx(_default_loss(out).item(), rel=1e-6)
    norms = {n.name: n.grad_norm for n in ctx.report.nodes if n.grad_norm is not None}
    assert norms  # the per-node grads came from the same backward
    assert all(p.grad is None for p in model.parameters())  # the pass leaves no grads


def test_a_no_grad_block_the_graph_does_not_keep_takes_the_eager_backward() -> None:
    """fx drops `torch.no_grad()`: the replay would reach `a`, the eager loss does not."""
    ctx = context_for(Two("nograd"), (torch.randn(3, 4),), user_files=[TESTS])
    gradients.run(ctx)
    verdicts = {r.name: r.verdict for r in ctx.report.gradients.params}
    assert verdicts == {"a.weight": "cut", "a.bias": "cut", "b.weight": "ok", "b.bias": "ok"}


def test_a_custom_backward_the_graph_does_not_keep_takes_the_eager_backward() -> None:
    """fx records Amplify's forward (a view), not its backward (x 3000): same loss, same
    leaves, but another autograd graph, so the eager backward gives the grads."""
    from test_exploding_verdicts import AmplifiedBackward

    model, x = AmplifiedBackward(3e3), torch.randn(4, 8)
    ctx = context_for(model, (x,), user_files=[TESTS])
    gradients.run(ctx)
    params = dict(model.named_parameters())
    expected = torch.autograd.grad(_default_loss(model(x)), list(params.values()))
    for row, grad in zip(ctx.report.gradients.params, expected, strict=True):
        assert row.grad_norm == pytest.approx(grad.norm().item(), rel=1e-6), row.name


GPT2_FORWARDS: list[int] = []


def tiny_gpt2() -> nn.Module:
    """transformers' GPT-2 from a tiny config that counts its eager forwards."""
    import transformers as tf

    no_dropout = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # the same values
    config = tf.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=256, n_positions=64, **no_dropout
    )
    torch.manual_seed(0)  # the same weights in the report and in the test
    model = tf.GPT2LMHeadModel(config)
    # the report loads this file as a module of its own: count in pytest's one
    import test_gradients_replay as counted

    model.register_forward_hook(lambda *_: counted.GPT2_FORWARDS.append(1))
    return model


def test_gpt2s_cache_outputs_of_the_graph_stay_out_of_the_replays_loss(tmp_path: Path) -> None:
    """transformers' GPT-2 returns its key/value cache in a DynamicCache, which the loss
    does not look into; its fx graph returns those tensors after the logits. The replay's
    loss is formed from the logits only, as eager's is, and its backward is the pass's:
    the eager forward and backward do not run again."""
    from inspector.analyze import inspect_model
    from inspector.context import Options

    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.save({"input_ids": ids}, tmp_path / "ids.pt")
    inputs = str(tmp_path / "ids.pt")
    GPT2_FORWARDS.clear()  # what loading, capture and the graph pass run
    inspect_model(f"{__file__}:tiny_gpt2", inputs, Options(passes={"graph"}, isolate=False))
    before = len(GPT2_FORWARDS)
    GPT2_FORWARDS.clear()
    options = Options(passes={"graph", "gradients", "numerics"}, isolate=False)
    report = inspect_model(f"{__file__}:tiny_gpt2", inputs, options)
    assert report.capture.method == "fx"
    # one eager forward, under the recorders; 2 before: it ran again, with its backward
    assert len(GPT2_FORWARDS) - before == 1
    section = report.gradients
    # the independent answer: torch.autograd on the same model's eager logits alone
    model = tiny_gpt2()
    logits = model(input_ids=ids).logits
    assert section.loss_value == pytest.approx(_default_loss(logits).item(), rel=1e-6)
    params = dict(model.named_parameters())
    expected = torch.autograd.grad(_default_loss(logits), list(params.values()))
    rows = {row.name: row.grad_norm for row in section.params}
    for (name, _), grad in zip(params.items(), expected, strict=True):
        assert rows[name] == pytest.approx(grad.norm().item(), rel=1e-5), name
    assert all(node.stats is not None for node in report.nodes if node.op == "call_module")
    assert not report.meta.warnings


class Branchy(nn.Module):
    """Branches on a value: no graph is captured (its nodes are its module calls)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(6, 5), nn.Linear(5, 3)
        self.forwards = self.backwards = 0
        self.a.register_full_backward_hook(self._count)

    def _count(self, module: nn.Module, grad_in: object, grad_out: object) -> None:
        self.backwards += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        h = torch.relu(self.a(x))
        if h.sum() > -1:
            h = h * 2
        return self.b(h)


def _module_output_grads(model: Branchy, x: torch.Tensor) -> dict[str, float]:
    """The independent answer: the loss's gradient w.r.t. each module's output ("": the
    model's own)."""
    outs: dict[str, torch.Tensor] = {}
    hooks = [
        m.register_forward_hook(lambda m, a, out, p=p: outs.setdefault(p, out))
        for p, m in model.named_modules()
    ]
    loss = _default_loss(model(x))
    for h in hooks:
        h.remove()
    grads = torch.autograd.grad(loss, list(outs.values()))
    return {p: g.norm().item() for p, g in zip(outs, grads, strict=True)}


def test_without_a_graph_the_eager_forward_and_backward_give_the_node_grads() -> None:
    """One forward and one backward (two of each before: the per-node grads ran the same
    eager forward again, with the same hooks); the numerics statistics come from it too."""
    model, x = Branchy(), torch.randn(4, 6)
    ctx = context_for(model, (x,), user_files=[TESTS])
    assert ctx.capture.method == "hooks" and ctx.capture.graph_module is None
    expected = _module_output_grads(Branchy(), x)
    model.forwards = 0
    gradients.run(ctx)
    assert (model.forwards, model.backwards) == (1, 1)
    by_path = {n.module_path: n.grad_norm for n in ctx.report.nodes if n.grad_norm is not None}
    assert by_path.keys() == expected.keys() == {"", "a", "b"}
    for path, norm in expected.items():
        assert by_path[path] == pytest.approx(norm, rel=1e-6), path
    observed = ctx.results.numerics_observed
    assert observed is not None and observed.method == "modules"
    assert {observed.paths[name] for name in observed.stats} >= {"a", "b"}
    # the statistics' own ops are not the model's: the one cut seen is its branch's
    assert [(c.op, c.source_line) for c in ctx.results.gradients.cuts] == [
        ("gt", "if h.sum() > -1:")
    ]
    assert ctx.report.gradients.error is None and not ctx.report.meta.warnings


def test_a_failing_per_node_hook_costs_the_per_node_grads_only(monkeypatch) -> None:
    import inspector.health.nodegrads as nodegrads

    def broken(result: object, name: str, grad: torch.Tensor) -> None:
        raise ValueError("statistics broke")

    monkeypatch.setattr(nodegrads, "record_grad", broken)
    model, x = Branchy(), torch.randn(4, 6)
    ctx = context_for(model, (x,), user_files=[TESTS])
    gradients.run(ctx)
    section = ctx.report.gradients
    assert section.error is None and all(r.verdict == "ok" for r in section.params)
    assert all(n.grad_norm is None for n in ctx.report.nodes)
    assert ctx.results.numerics_observed is None  # numerics runs its own forward
    assert ctx.report.meta.warnings == ["gradients: per-node gradients skipped (statistics broke)"]
