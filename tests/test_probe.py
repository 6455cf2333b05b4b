"""The probe pass runs a real model's forward on a fake copy (no arithmetic) where a fake
step costs less than a real one, and for real where the fake copy needs values (issue
#17: no pass repeats a real forward it does not need); beside the other passes, its
findings are those of the pass run in order."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from graph_helpers import inspect_ctx, make_ctx
from torch import nn

from inspector.context import Context, InputFactory, Inputs, LoadedModel, Options
from inspector.passes import memory, probe
from inspector.realcost import REAL_STEP_FORWARDS
from inspector.report import Report

USER_FILE = __file__


class MakesParam(nn.Module):
    """Makes a parameter in forward (the `param-created-in-forward` finding) and counts
    its forwards on real tensors; `branch`: decides a branch on a value first. `width`:
    wide, its arithmetic costs more than a fake step's Python; narrow, the other way."""

    def __init__(self, branch: bool, width: int = 1024) -> None:
        super().__init__()
        self.fc = nn.Sequential(*(nn.Linear(width, width) for _ in range(4)))
        self.branch, self.width = branch, width
        self.real_calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(x) is torch.Tensor:
            self.real_calls += 1
        if self.branch and x.sum().item() > 1e9:
            return x
        scale = nn.Parameter(torch.ones(self.width))  # MADE-HERE
        return self.fc(x) * scale


def _probed(model: nn.Module, batch: int = 512) -> Context:
    """A real forward timed (the load's input check does it), the memory pass (which
    times a fake training step), then the probe."""
    loaded = LoadedModel(model, "python", "test_probe.py", user_files=[USER_FILE])
    inputs = Inputs((torch.randn(batch, model.width),), {})
    ctx = Context(loaded, InputFactory(), inputs, Options(), Report())
    with torch.no_grad():
        model(*inputs.args)  # warm
        began = time.perf_counter()
        model(*inputs.args)
        ctx.results.real_forward_seconds = time.perf_counter() - began
    memory.run(ctx)
    model.real_calls = 0
    probe.run(ctx)
    return ctx


def _fake_step_cheaper(ctx: Context) -> bool:
    fake, forward = ctx.results.memory.rerun_cost, ctx.results.real_forward_seconds
    return fake < REAL_STEP_FORWARDS * forward


def _made_line() -> int:
    lines = Path(USER_FILE).read_text().splitlines()
    return next(i for i, t in enumerate(lines, 1) if t.endswith("# MADE-HERE"))


def test_the_probe_sees_a_real_models_forward_on_a_fake_copy() -> None:
    model = MakesParam(branch=False)
    ctx = _probed(model)
    assert _fake_step_cheaper(ctx)  # 4 x 1024^2 x 512: seconds of GEMMs
    assert model.real_calls == 0  # the forward ran, on fake tensors only
    [made] = ctx.results.created_in_forward
    assert made.what == "Parameter" and made.location == f"test_probe.py:{_made_line()}"
    # the user's model gained no parameter
    expected = [f"fc.{i}.{kind}" for i in range(4) for kind in ("weight", "bias")]
    assert [name for name, _ in model.named_parameters()] == expected


def test_a_model_whose_fake_step_costs_more_is_probed_for_real() -> None:
    model = MakesParam(branch=False, width=4)
    ctx = _probed(model, batch=2)
    assert not _fake_step_cheaper(ctx)
    assert model.real_calls == 1
    assert len(ctx.results.created_in_forward) == 1


def test_a_forward_that_needs_a_value_is_probed_for_real() -> None:
    model = MakesParam(branch=True)
    ctx = _probed(model)
    assert model.real_calls == 1  # the fake copy stopped at .item(): one real forward
    [made] = ctx.results.created_in_forward
    assert made.location == f"test_probe.py:{_made_line()}"


class Scores(nn.Module):
    """An attention-like softmax: its saturation needs values."""

    def __init__(self) -> None:
        super().__init__()
        self.real_calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(x) is torch.Tensor:
            self.real_calls += 1
        scores = torch.matmul(x, x.transpose(-1, -2))
        return torch.softmax(scores, dim=-1) @ x


def test_an_attention_softmax_is_probed_for_real_for_its_saturation() -> None:
    model = Scores()
    loaded = LoadedModel(model, "python", "test_probe.py", user_files=[USER_FILE])
    ctx = Context(loaded, InputFactory(), Inputs((torch.randn(2, 3, 4),), {}), Options(), Report())
    assert probe._on_fake_copy(ctx) is None  # the copy finds the softmax: the real run
    assert model.real_calls == 0
    probe.run(ctx)
    assert model.real_calls == 1
    [found] = ctx.results.attention_softmaxes
    assert not found.fake and found.rows == 6 and not found.scaled


class Classifier(nn.Module):
    """A softmax over logits, no matmul: not what an attention softmax is made of."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.real_calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(x) is torch.Tensor:
            self.real_calls += 1
        return torch.softmax(self.fc(x), dim=-1)


@pytest.mark.parametrize(
    ("build", "copies", "attention"), [(Scores, 0, True), (Classifier, 1, False)]
)
def test_a_graph_calling_softmax_and_matmul_is_probed_for_real_without_a_copy(
    monkeypatch: pytest.MonkeyPatch, build: type, copies: int, attention: bool
) -> None:
    """Where fake runs are the cheap ones, the captured graph's calls decide whether the
    fake copy is made: with a softmax and a matmul in it, the copy would find the
    attention softmax and the real forward would follow (the same findings, one forward
    fewer); a softmax alone gets the copy, which is enough."""
    ctx = make_ctx(build, lambda: ((torch.randn(2, 3, 4),), {}), user_files=(USER_FILE,))
    inspect_ctx(ctx)
    assert probe._attention_in_graph(ctx) is attention
    made = []
    copy = probe._on_fake_copy
    monkeypatch.setattr(probe, "_on_fake_copy", lambda c: made.append(1) or copy(c))
    monkeypatch.setattr(probe, "_fake_is_cheaper", lambda c: True)
    model = ctx.model
    probe.run(ctx)
    assert len(made) == copies
    assert model.real_calls == 1 - copies  # the copy was enough for the classifier
    if attention:
        [found] = ctx.results.attention_softmaxes
        assert not found.fake and found.rows == 6  # 2 x 3 rows of scores, with values
    else:
        assert ctx.results.attention_softmaxes == []


def test_an_export_graphs_softmax_and_matmul_are_read_from_their_aten_names() -> None:
    from inspector.report import Node

    ctx = make_ctx(Scores, lambda: ((torch.randn(2, 3, 4),), {}), user_files=(USER_FILE,))
    calls = ["aten.bmm.default", "aten._softmax.default", "aten.view.default"]
    ctx.report.nodes = [Node(id=i, name=f"n{i}", op="call_function", target=t)
                        for i, t in enumerate(calls)]  # fmt: skip
    assert probe._attention_in_graph(ctx)
    ctx.report.nodes = [Node(id=0, name="attn", op="call_module", target="attn")]
    assert not probe._attention_in_graph(ctx)  # a module call says nothing of its inside
