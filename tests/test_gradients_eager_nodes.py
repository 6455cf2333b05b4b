"""The gradients pass meets the fx graph's nodes on its eager forward (issue #17,
inspector/health/eagergraph.py): where every node is met in order, the per-node values
and gradients are the eager forward's and backward's own and no replay runs; where a call
is not the graph's next node, the replay runs as before."""

from __future__ import annotations

import operator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations

from inspector.health import eagergraph, nodegrads
from inspector.health.adhoc import context_for
from inspector.passes import gradients

TESTS = str(Path(__file__).parent)


class Mixed(nn.Module):
    """Leaf modules, a function, a method, operators, a tuple output taken apart, a size
    read off a tensor: each kind of node an fx graph holds."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv1d(4, 6, 3, padding=1)
        self.lstm = nn.LSTM(6, 5, batch_first=True)
        self.head = nn.Linear(5, 3)
        self.head_calls = 0
        self.head.register_forward_hook(self._count)
        self.kept: dict[str, torch.Tensor] = {}

    def _count(self, module: nn.Module, args: object, output: torch.Tensor) -> None:
        self.head_calls += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        h = h.transpose(1, 2)
        seq, _ = self.lstm(h)
        last = seq[:, -1]
        scale = last.shape[-1] ** 0.5
        out = self.head(last / scale)
        out = 2 - out
        out += 1
        return out


class WithConstant(Mixed):
    """Makes a tensor of a Python number: fx keeps it as a constant (an attribute of the
    graph's), eager calls torch.tensor at each forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * torch.tensor(3.0)


def shifted(x: torch.Tensor) -> torch.Tensor:
    """One node of the graph's (torch.fx.wrap), two calls of eager's."""
    return x * 2 + 1


torch.fx.wrap("shifted")


class WithWrapped(Mixed):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return shifted(super().forward(x))


def _unmatched(monkeypatch) -> None:  # noqa: ANN001
    """The replay's path, as before: every watching ends unmet."""
    finish = eagergraph.EagerGraphNodes.finish

    def unmet(self, output) -> None:  # noqa: ANN001
        finish(self, output)
        self.matched, self.unmet = False, "forced"

    monkeypatch.setattr(eagergraph.EagerGraphNodes, "finish", unmet)


def _report(model: nn.Module, x: torch.Tensor):  # noqa: ANN202
    ctx = context_for(model, (x,), user_files=[TESTS])
    assert ctx.capture.method == "fx"
    gradients.run(ctx)
    return ctx


def _stats(ctx) -> dict:  # noqa: ANN001
    """Each node's value statistics, as the numerics pass takes them from this forward."""
    return {name: vars(s) for name, s in ctx.results.numerics_observed.stats.items()}


def test_every_node_met_gives_the_eager_values_and_grads_without_a_replay(monkeypatch) -> None:
    x = torch.randn(2, 4, 7)
    model = Mixed()
    ctx = _report(model, x)
    assert model.head_calls == 1  # the eager forward only: the replay calls it again
    names = [n.name for n in ctx.report.nodes]
    norms = {n.name: n.grad_norm for n in ctx.report.nodes}

    # the independent answer: torch.autograd on the eager model's own tensors
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str):  # noqa: ANN202
        def hook(module: nn.Module, args: object, output: object) -> None:
            seen[name] = output[0] if isinstance(output, tuple) else output

        return hook

    for name in ("conv", "lstm", "head"):
        getattr(model, name).register_forward_hook(keep(name))
    out = model(x)
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(20_161))
    loss = (out * r).mean()
    grads = torch.autograd.grad(loss, [seen["conv"], seen["lstm"], seen["head"]])
    for name, grad in zip(("conv", "lstm", "head"), grads, strict=True):
        assert norms[name] == pytest.approx(grad.norm().item(), rel=1e-6), name
    assert ctx.report.gradients.loss_value == pytest.approx(loss.item(), rel=1e-6)
    # every node the replay names has its value's statistics, and the same ones
    met = _stats(ctx)
    assert ctx.results.numerics_observed is not None and not ctx.report.meta.warnings
    _unmatched(monkeypatch)
    replayed_model = Mixed()
    replayed = _report(replayed_model, x)
    assert replayed_model.head_calls == 2  # the eager forward, then the replay
    assert [n.name for n in replayed.report.nodes] == names
    assert met.keys() == _stats(replayed).keys() and len(met) >= 9
    for name, stats in _stats(replayed).items():
        for key, value in stats.items():
            if isinstance(value, float):
                assert met[name][key] == pytest.approx(value, rel=1e-6, nan_ok=True), (name, key)
            else:
                assert met[name][key] == value, (name, key)
    assert norms == pytest.approx({n.name: n.grad_norm for n in replayed.report.nodes})


def test_a_call_the_graph_does_not_have_next_takes_the_replay(monkeypatch) -> None:
    watched: list[eagergraph.EagerGraphNodes] = []
    finish = eagergraph.EagerGraphNodes.finish

    def kept(self, output) -> None:  # noqa: ANN001
        finish(self, output)
        watched.append(self)

    monkeypatch.setattr(eagergraph.EagerGraphNodes, "finish", kept)
    x = torch.randn(2, 4, 7)
    model = WithWrapped()
    ctx = _report(model, x)
    assert not watched[0].matched
    assert watched[0].unmet == "mul called where the graph has shifted next"
    assert model.head_calls == 2  # the replay ran
    assert all(n.grad_norm is not None for n in ctx.report.nodes if n.op == "call_module")
    assert ctx.results.numerics_observed is not None and not ctx.report.meta.warnings


def test_a_constant_made_at_each_forward_is_the_graphs_attribute(monkeypatch) -> None:
    x = torch.randn(2, 4, 7)
    model = WithConstant()
    ctx = _report(model, x)
    assert model.head_calls == 1  # met: no replay
    met = {n.name: n.grad_norm for n in ctx.report.nodes}
    stats = _stats(ctx)
    _unmatched(monkeypatch)
    replayed = _report(WithConstant(), x)
    assert met == pytest.approx({n.name: n.grad_norm for n in replayed.report.nodes})
    assert stats.keys() == _stats(replayed).keys()
    assert met["mul"] is not None  # the node the constant multiplies into


def test_a_no_grad_block_takes_the_replay_and_its_verdicts() -> None:
    """fx drops `torch.no_grad()`: its calls are not met, the replay's loss check then
    sends the pass to the eager backward, whose verdicts say the layer is cut."""
    from test_rules import Two

    ctx = _report(Two("nograd"), torch.randn(3, 4))
    verdicts = {r.name: r.verdict for r in ctx.report.gradients.params}
    assert verdicts == {"a.weight": "cut", "a.bias": "cut", "b.weight": "ok", "b.bias": "ok"}


class SpectralNormed(nn.Module):
    """spectral_norm's power iteration updates its vectors at each train() forward."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = parametrizations.spectral_norm(nn.Linear(8, 8))
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc(x)))


def test_a_model_that_changes_at_each_forward_is_judged_on_its_first() -> None:
    """The replay ran a second forward, whose loss was another (the power iteration had
    moved on), then the eager forward a third time: the grads were the third forward's.
    Met on the eager forward, they are the first's, as a training step from the model
    as it stands gives them."""
    x = torch.randn(5, 8)
    ctx = _report(SpectralNormed(), x)
    model = SpectralNormed()  # the same weights and vectors, fresh
    out = model(x)
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(20_161))
    loss = (out * r).mean()
    params = dict(model.named_parameters())
    expected = torch.autograd.grad(loss, list(params.values()))
    assert ctx.report.gradients.loss_value == pytest.approx(loss.item(), rel=1e-6)
    rows = {row.name: row.grad_norm for row in ctx.report.gradients.params}
    for name, grad in zip(params, expected, strict=True):
        assert rows[name] == pytest.approx(grad.norm().item(), rel=1e-5), name


def test_a_failing_per_node_hook_costs_the_per_node_grads_only(monkeypatch) -> None:
    def broken(result: object, name: str, grad: torch.Tensor) -> None:
        raise ValueError("statistics broke")

    monkeypatch.setattr(nodegrads, "record_grad", broken)
    model = Mixed()
    ctx = _report(model, torch.randn(2, 4, 7))
    assert model.head_calls == 1
    section = ctx.report.gradients
    assert section.error is None and all(r.verdict == "ok" for r in section.params)
    assert all(n.grad_norm is None for n in ctx.report.nodes)
    assert ctx.results.numerics_observed is None  # numerics runs its own forward
    assert ctx.report.meta.warnings == ["gradients: per-node gradients skipped (statistics broke)"]


@pytest.mark.parametrize(
    ("target", "called", "same"),
    [
        (operator.truediv, torch.Tensor.div, True),  # `x / y` calls Tensor.div
        (operator.sub, torch.Tensor.__rsub__, True),  # `2 - x`
        (operator.iadd, torch.Tensor.add_, True),  # `x += 1`
        (operator.getitem, torch.Tensor.__getitem__, True),
        (torch.relu, torch.relu, True),
        (operator.add, torch.Tensor.mul, False),
        (torch.relu, torch.sigmoid, False),
    ],
)
def test_a_call_is_the_node_of_its_function_or_operator(target, called, same: bool) -> None:  # noqa: ANN001
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    node = graph.call_function(target, (x, x))
    assert eagergraph._same_call(node, called) is same
