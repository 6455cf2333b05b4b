"""The graph pass's meta run against the independent ways it replaces: a run on the real
inputs for shapes and forward FLOPs, and a measured fake backward for backward FLOPs."""

from __future__ import annotations

from functools import cache

import models
import pytest
import torch
from graph_helpers import MODELS, inspect_ctx, make_ctx
from test_graph import DIMS
from torch import nn

from inspector import capture
from inspector.passes import graph as graph_pass
from inspector.report import Report
from inspector.results import GraphRun


def _run(name: str, *, meta: bool, fake: bool = False) -> tuple[Report, GraphRun]:
    ctx = make_ctx(*MODELS[name], DIMS[name], fake=fake)
    saved = graph_pass._meta_records
    if not meta:
        graph_pass._meta_records = lambda ctx: None
    try:
        report = inspect_ctx(ctx)
    finally:
        graph_pass._meta_records = saved
    return report, ctx.results.graph


@cache
def _pair(name: str) -> tuple[Report, GraphRun, Report]:
    with_meta, ran = _run(name, meta=True)
    without, _ = _run(name, meta=False)
    return with_meta, ran, without


@pytest.mark.parametrize("name", sorted(DIMS))
def test_meta_run_agrees_with_the_real_run(name: str) -> None:
    meta, _, real = _pair(name)
    assert [n.name for n in meta.nodes] == [n.name for n in real.nodes]
    for a, b in zip(meta.nodes, real.nodes, strict=True):
        assert [(t.shape, t.dtype, t.device) for t in a.output_tensors] == [
            (t.shape, t.dtype, t.device) for t in b.output_tensors
        ], a.name
        assert [t.sym_shape for t in a.output_tensors] == [t.sym_shape for t in b.output_tensors], (
            a.name
        )
        assert (a.flops, a.params, a.output_bytes) == (b.flops, b.params, b.output_bytes), a.name
    assert meta.totals == real.totals


@pytest.mark.parametrize("name", sorted(DIMS))
def test_counted_backward_equals_the_measured_backward(name: str) -> None:
    """Backward FLOPs from torch's backward formulas on the forward ops (meta run) equal
    those FlopCounterMode measures in a fake forward + backward, per module too."""
    meta, ran, measured = _pair(name)
    if name != "data_dependent":  # its `if x.sum() > 0` needs values: real run
        assert ran.on_meta and ran.backward_counted, name
    assert meta.totals.flops_backward == measured.totals.flops_backward > 0
    # per module, the measured numbers are not a reference: torch's module tracker puts
    # some backward ops in whatever module's backward is open (image's weight grad lands
    # in `text` in some runs, and HF models are worse); each node's own module is exact


def test_backward_per_module_by_hand() -> None:
    meta, _, _ = _pair("dict_in_tuple_out")
    # image = Linear(16, 8) on [B=4, 16]: forward 2 * 4 * 16 * 8 = 1024; backward: the
    # weight grad only (the input needs no grad) = 1024. text = Embedding: no matmul.
    assert meta.module("image").flops_backward == 1_024
    assert meta.module("text").flops_backward == 0


def test_the_users_model_is_untouched_by_the_meta_run() -> None:
    torch.manual_seed(0)
    model = models.ResNet18()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ctx = make_ctx(lambda: model, lambda B: ((torch.randn(B, 3, 32, 32),), {}), {"B": 2})
    inspect_ctx(ctx)
    assert ctx.results.graph.on_meta
    after = model.state_dict()
    assert all(t.device.type == "cpu" for t in after.values())
    assert all(torch.equal(before[k], after[k]) for k in before)  # BatchNorm stats too
    assert all(p.grad is None for p in model.parameters())


class ReadsAValue(nn.Module):
    """A leaf that reads a tensor's value: meta cannot run it, the real run can."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = int(x.abs().sum().item() > -1) + 1  # always 2, known only from a value
        return self.lin(x).repeat(1, n)


def test_a_model_that_needs_values_runs_on_the_real_inputs() -> None:
    ctx = make_ctx(ReadsAValue, lambda B: ((torch.randn(B, 8),), {}), {"B": 3})
    report = inspect_ctx(ctx)
    assert not ctx.results.graph.on_meta
    assert report.module("").output_shapes == [["B", 16]]
    # 2 * B * 8 * 8 forward; backward: weight grad only (the input needs none)
    assert report.totals.flops_forward == 384
    assert report.totals.flops_backward == 384


class FrozenFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 4)
        self.a.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            teacher = self.b(x.new_zeros(x.shape[0], 32))  # no backward at all
        return self.b(torch.relu(self.a(x))) + teacher


@pytest.mark.parametrize("fake", [False, True])
def test_backward_skips_frozen_layers_and_no_grad_blocks(fake: bool) -> None:
    ctx = make_ctx(FrozenFirst, lambda B: ((torch.randn(B, 16),), {}), {"B": 5}, fake=fake)
    report = inspect_ctx(ctx)
    assert ctx.results.graph.backward_counted
    # forward: a 2*5*16*32 + b twice 2*5*32*4 = 5120 + 2 * 1280
    assert report.totals.flops_forward == 5_120 + 2_560
    # backward: b's weight grad and input grad (2 * 1280); `a` is frozen and its input
    # needs no grad: nothing; the no_grad call of b: nothing
    assert report.totals.flops_backward == 2_560
    assert report.module("a").flops_backward == 0


def test_stacks_are_recorded_only_where_a_user_line_can_be_named() -> None:
    from inspector.tracebacks import runs_user_code

    files = [models.__file__]
    assert runs_user_code(models.ResNet18(), files)
    assert not runs_user_code(models.make_gpt2(n_layer=1, n_embd=32, n_head=2)[0], files)
    # a guided fx capture of a user's model keeps its lines on the nodes
    ctx = make_ctx(ShapeBranch, lambda B: ((torch.randn(B, 8),), {}), {"B": 2},
                   user_files=(__file__,))  # fmt: skip
    report = inspect_ctx(ctx)
    assert report.capture.method == "fx" and ctx.capture.stack_traces
    assert "symbolic_trace failed" in report.capture.attempts[0].error
    lines = {n.location for n in report.nodes if n.op == "call_function" and n.output_tensors}
    assert lines == {f"test_meta_run.py:{ShapeBranch.LINE}"}  # matmul, t, relu
    # and so does an export capture of it
    ctx = make_ctx(ShapeBranch, lambda B: ((torch.randn(B, 8),), {}), {"B": 2},
                   user_files=(__file__,))  # fmt: skip
    ctx.capture, _ = capture._export(ctx)
    graph_pass.run(ctx)
    lines = {n.location for n in ctx.report.nodes if n.op == "call_function" and n.output_tensors}
    assert lines == {f"test_meta_run.py:{ShapeBranch.LINE}"}


class ShapeBranch(nn.Module):
    """A branch on a shape: fx cannot trace it, export can."""

    LINE = 0

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] == 8:
            return torch.relu(x @ self.lin.weight.t())
        return x


ShapeBranch.LINE = ShapeBranch.forward.__code__.co_firstlineno + 2


def test_a_module_reached_by_two_paths_gets_its_own_parameters_back() -> None:
    """timm CoaT hands one position-encoding conv to several blocks: swapped for meta
    under each of its paths, the second swap kept the first's meta copy as the original,
    and the user's model came out with meta parameters (its memory pass and gradients
    then failed: 'expected device meta but got cpu')."""
    from torch import nn

    from inspector.graph.metarun import run_on_meta

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pos = nn.Conv2d(4, 4, 3, padding=1)
            self.blocks = nn.ModuleList([nn.Sequential(self.pos, nn.ReLU()) for _ in range(2)])
            self.tied = nn.Linear(4, 4)
            self.head = nn.Linear(4, 4)
            self.head.weight = self.tied.weight  # a tied tensor in two modules

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return self.head(self.tied(x.mean((2, 3))))

    model = Shared()
    before = {n: p for n, p in model.named_parameters(remove_duplicate=False)}
    seen = run_on_meta(
        model,
        lambda: (
            model.pos.weight.device.type,
            model(torch.empty(2, 4, 8, 8, device="meta")).device.type,
        ),
    )
    assert seen == ("meta", "meta")
    after = dict(model.named_parameters(remove_duplicate=False))
    assert after.keys() == before.keys()
    assert all(after[n] is before[n] for n in before)  # the same objects, on the CPU
    assert model.head.weight is model.tied.weight
