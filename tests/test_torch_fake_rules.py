"""torch's fake runs answered by rule (inspector/torchfakerules.py): Dynamo's check and
torch.export's program the same as from torch's own fake kernels, static and with a dim
made dynamic; torch's dispatch back in place after."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import inspector.compiling.dynamo as dynamo_check
from inspector.context import Inputs
from inspector.fakevalues import new_fake_mode
from inspector.torchfakerules import rules_in_torch_modes


class ConvNet(nn.Module):
    """The calls the rules take from Dynamo's trace: training-mode batch norms and
    hardswish at several sizes, a layer norm and a softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.Hardswish())
        self.body = nn.Sequential(
            nn.Conv2d(8, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.Hardswish(),
            nn.Conv2d(16, 24, 3, 2, 1), nn.BatchNorm2d(24), nn.Hardsigmoid(),
        )  # fmt: skip
        self.norm, self.head = nn.LayerNorm(24), nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(self.stem(x)).mean((2, 3))
        return torch.softmax(self.head(self.norm(y)), -1)


def _inputs(batch: int) -> Inputs:
    return Inputs(args=(torch.randn(batch, 3, 32, 32),), dims={"B": batch})


def _facts(checked: dynamo_check.Checked) -> tuple:
    recompiles = [([(f.code, f.reasons) for f in failures], error)
                  for failures, error in checked.recompiles]  # fmt: skip
    return checked.graph_count, checked.op_count, len(checked.breaks), recompiles


@pytest.mark.parametrize("count_all", [False, True])
def test_the_check_is_the_same_as_from_torchs_fake_kernels(monkeypatch, count_all) -> None:
    """With the rules (most batch norms and hardswishes answered by them) and without:
    the same graphs, ops and guards; with `count_all` the batch turns dynamic in the
    recompiles, whose symbolic calls take torch's path."""
    answered = []

    @contextlib.contextmanager
    def counted():  # noqa: ANN202
        with rules_in_torch_modes() as rules:
            yield rules
        answered.append(rules.hits)

    model = ConvNet().train()
    changed = [_inputs(3), _inputs(5)]
    monkeypatch.setattr(dynamo_check, "rules_in_torch_modes", counted)
    with_rules = dynamo_check.check(model, _inputs(4), changed, count_all=count_all)
    monkeypatch.setattr(dynamo_check, "rules_in_torch_modes", contextlib.nullcontext)
    without = dynamo_check.check(model, _inputs(4), changed, count_all=count_all)
    assert _facts(with_rules) == _facts(without)
    assert with_rules.graph_count == 1 and with_rules.op_count == without.op_count > 10
    if count_all:  # the guard on the batch failed once, then the dim was dynamic
        assert [len(failures) for failures, _ in with_rules.recompiles] == [1, 0]
    # the second and third batch norms and the second hardswish, at least
    assert answered[0] >= 3


def test_symbolic_sizes_take_torchs_path() -> None:
    """A call on a tensor with a symbolic size is not the rules' to answer."""
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    mode = FakeTensorMode(shape_env=ShapeEnv())
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    with rules_in_torch_modes() as rules:
        x = mode.from_tensor(torch.empty(6, 8), symbolic_context=dynamic)
        assert x._has_symbolic_sizes_strides
        with mode:
            for _ in range(3):
                torch.nn.functional.hardswish(x)
            assert rules.hits == 0
            for n in (4, 5, 6):  # static: the first takes torch's path, the others the rule
                torch.nn.functional.hardswish(torch.empty(n, 8))
    assert rules.hits == 2


def test_torchs_dispatch_is_back_after_the_check_and_ours_untouched() -> None:
    original = FakeTensorMode.dispatch
    with pytest.raises(RuntimeError, match="stop"), rules_in_torch_modes() as rules:
        assert FakeTensorMode.dispatch is not original
        ours = new_fake_mode()  # the memory pass's mode answers by its own rules
        with ours:
            torch.nn.functional.hardswish(torch.empty(4, 8))
            torch.nn.functional.hardswish(torch.empty(5, 8))
        assert rules.hits == 0 and ours.rules.hits == 1
        raise RuntimeError("stop")
    assert FakeTensorMode.dispatch is original


def _graph(program: torch.export.ExportedProgram) -> list:
    """Each node's op, target, arguments and output metadata."""
    out = []
    for node in program.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, list | tuple) else [val]
        metas = [
            (tuple(v.shape), v.stride(), v.dtype) if isinstance(v, torch.Tensor) else repr(v)
            for v in vals
        ]
        out.append((node.op, str(node.target), str(node.args), metas))
    return out


@pytest.mark.parametrize("dynamic", [False, True])
def test_an_export_is_the_same_as_from_torchs_fake_kernels(monkeypatch, dynamic) -> None:
    """The eval-mode batch norms (8-18 ms a new size in torch's kernel) by rule: the same
    program, node by node; with the batch dynamic, no call on a symbolic size by rule."""
    from inspector.fakerules import FakeRules

    symbolic, answer = [], FakeRules.answer

    def spied(self, key, func, args, kwargs):  # noqa: ANN001, ANN202
        out = answer(self, key, func, args, kwargs)
        if out is not None:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            symbolic.append(any(t._has_symbolic_sizes_strides for t in tensors))
        return out

    monkeypatch.setattr(FakeRules, "answer", spied)
    model = ConvNet().eval()
    args = (torch.randn(4, 3, 32, 32),)
    shapes = ({0: torch.export.Dim.AUTO},) if dynamic else None
    with rules_in_torch_modes() as rules:
        with_rules = torch.export.export(model, args, dynamic_shapes=shapes, strict=False)
    without = torch.export.export(model, args, dynamic_shapes=shapes, strict=False)
    assert _graph(with_rules) == _graph(without)
    assert len(_graph(without)) > 20
    assert len(symbolic) == rules.hits and not any(symbolic)
    if not dynamic:  # the second and third batch norms and hardswish, at least
        assert rules.hits >= 3
    else:  # the batch is symbolic in the program
        placeholder = next(n for n in with_rules.graph.nodes if n.name == "x")
        assert isinstance(placeholder.meta["val"].shape[0], torch.SymInt)
    x = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(with_rules.module()(x), without.module()(x), rtol=0, atol=0)


class Positions(nn.Module):
    """As BERT's embeddings begin: a slice of a buffer, torch's fake mode first met under
    the export's tracing mode (where the rules' tensor maker is made)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("ids", torch.arange(64).unsqueeze(0).clone())  # no view
        self.embed, self.net = nn.Embedding(64, 3), ConvNet().eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = self.ids[:, : x.shape[2]]
        return self.net(x + self.embed(ids).transpose(1, 2)[..., None])


def test_the_rules_put_nothing_of_their_own_into_an_exports_graph() -> None:
    model, args = Positions().eval(), (torch.randn(2, 3, 32, 32),)
    with rules_in_torch_modes() as rules:
        with_rules = torch.export.export(model, args, strict=False)
    without = torch.export.export(model, args, strict=False)
    assert rules.hits >= 3
    assert _graph(with_rules) == _graph(without)
    assert not [n for n in with_rules.graph.nodes if n.target == torch.ops.aten.empty.memory_format]
