"""Capture: fx, then torch.export, then hooks; every attempt recorded with the user's line."""

from __future__ import annotations

from pathlib import Path

import models
import pytest
import torch
from graph_helpers import MODELS, inspect_ctx, make_ctx, run_model
from torch import nn

from inspector.capture import capture_graph

THIS = str(Path(__file__))


def _line_of(path: str, text: str) -> int:
    """1-based line number of `text` in `path`: found independently of the tracebacks."""
    lines = Path(path).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


@pytest.mark.parametrize("fake", [False, True])
def test_data_dependent_fx_fails_at_the_if_line_and_hooks_succeed(fake: bool) -> None:
    report = run_model("data_dependent", fake=fake, B=4)
    fx, export, hooks = report.capture.attempts
    line = _line_of(models.__file__, "if h.sum() > 0:")
    assert (fx.method, fx.ok) == ("fx", False)
    assert fx.location == f"models.py:{line}"
    assert fx.source_line.startswith("if h.sum() > 0:")
    assert fx.error_type == "TraceError"
    assert (export.method, export.ok) == ("export", False)
    assert export.location == f"models.py:{line}"  # export's data-dependent guard, same line
    assert (hooks.method, hooks.ok) == ("hooks", True)
    assert report.capture.method == "hooks"
    # one node per module call: the root, a, b
    assert [(n.op, n.name) for n in report.nodes] == [
        ("module", "model"),
        ("module", "a"),
        ("module", "b"),
    ]
    # b: Linear(8, 4) on [B, 8] -> [B, 4]
    # b: Linear(8, 4) on [B, 8] -> [B, 4]; B found by a (fake) hooks run with B halved
    assert report.module("b").output_shapes == [["B", 4]]
    assert report.module("b").flops_forward == 2 * 4 * 8 * 4  # 2 * B * in * out


def test_gpt2_plain_fx_fails_and_guided_fx_succeeds() -> None:
    report = run_model("gpt2", B=2, S=8)
    (fx,) = report.capture.attempts  # see test_guided_fx: checked against export there
    assert fx.ok and report.capture.method == "fx"
    assert "co_varnames" in fx.error  # why plain symbolic_trace failed, kept as a note
    assert report.capture.node_count > 50
    # logits [B, S, vocab]
    assert report.module("").output_shapes[0] == ["B", "S", 100]


class Gate(nn.Module):
    """fx cannot trace this block (it reads a value); its parent is fine."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.mean() > 100:  # never true; fx cannot know
            y = y * 0
        return y


class WithGate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(4, 6)
        self.gate = Gate()
        self.post = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(torch.relu(self.gate(self.pre(x))))


def _with_gate_ctx(fake: bool = False):
    return make_ctx(
        WithGate, lambda B: ((torch.randn(B, 4),), {}), {"B": 3}, fake=fake, user_files=(THIS,)
    )


@pytest.mark.parametrize("fake", [False, True])
def test_fx_keeps_an_untraceable_submodule_as_a_leaf(fake: bool) -> None:
    report = inspect_ctx(_with_gate_ctx(fake))
    (fx,) = report.capture.attempts
    assert fx.ok and report.capture.method == "fx"
    assert "'gate'" in fx.error and "kept whole" in fx.error
    assert fx.location == f"test_capture.py:{_line_of(THIS, 'if y.mean() > 100:')}"
    gate = [n for n in report.nodes if n.op == "call_module" and n.target == "gate"]
    assert len(gate) == 1 and gate[0].output_tensors[0].shape == [3, 6]
    # the rest of the graph is kept: pre, relu, post around the gate
    assert [n.target for n in report.nodes if n.op == "call_module"] == ["pre", "gate", "post"]
    # FLOPs of the leaf are still measured: 2 * B * 6 * 6 = 2 * 3 * 36 = 216
    assert gate[0].flops == 216


def test_dict_in_tuple_out_traces_with_fx() -> None:
    report = run_model("dict_in_tuple_out", B=4)
    assert report.capture.method == "fx"
    root = report.module("")
    # image Linear(16, 8) on [B, 16]; tokens [B, 5] -> Embedding(100, 8) -> mean(1) -> [B, 8]
    assert root.output_shapes == [["B", 8], ["B", 8]]
    assert root.input_shapes == [["B", 16], ["B", 5]]
    assert report.module("text").output_shapes == [["B", 5, 8]]


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = int(x.shape[1]) + 1  # fx: a Proxy has no int value
        return self.lin(x) @ torch.ones(n, n)  # shapes do not fit


@pytest.mark.parametrize("fake", [False, True])
def test_every_method_failing_is_reported_with_the_users_line(fake: bool) -> None:
    ctx = make_ctx(
        Broken, lambda B: ((torch.randn(B, 4),), {}), {"B": 2}, fake=fake, user_files=(THIS,)
    )
    result = capture_graph(ctx)
    assert result.method is None
    assert [a.method for a in result.attempts] == ["fx", "export", "hooks"]
    fx, export, hooks = result.attempts
    assert not fx.ok and fx.location == f"test_capture.py:{_line_of(THIS, 'n = int(x.shape[1])')}"
    line = _line_of(THIS, "@ torch.ones(n, n)")
    assert not hooks.ok and hooks.location == f"test_capture.py:{line}"
    assert hooks.source_line.startswith("return self.lin(x) @ torch.ones(n, n)")
    assert not export.ok and export.location == f"test_capture.py:{line}"
    report = inspect_ctx(ctx)  # the graph pass still gives the module tree and params
    assert report.nodes == [] and report.totals.params == 4 * 4 + 4
    assert any("no capture method" in w for w in report.meta.warnings)


def test_attempts_are_timed() -> None:
    report = run_model("mlp", B=2)
    (fx,) = report.capture.attempts
    assert fx.ok and fx.error is None and 0 < fx.seconds < 30


def test_every_test_model_captures() -> None:
    assert set(MODELS) == set(models.ALL)  # the table covers every shared test model


class _IdReused(nn.Module):
    """`a`'s output is freed before `b` runs on a tensor that no module returned, made
    until it sits at the freed one's address (its `id`)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.reused = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        freed = id(h)
        del h
        kept = []
        for _ in range(1000):
            t = x * 2
            if id(t) == freed:
                self.reused = True
                break
            kept.append(t)  # held, so the next one is made elsewhere
        return self.b(t)


def test_a_freed_outputs_address_taken_by_another_tensor_is_not_an_edge() -> None:
    from inspector.graph.hooks import record_hooks

    model, x = _IdReused(), torch.randn(2, 4)
    # without the FLOP counter's dispatch mode, which makes each `x * 2` elsewhere
    records = record_hooks(model, lambda: model(x), count_flops=False)
    assert model.reused  # the case under test happened
    by_name = {r.name: r for r in records}
    # b's input came from `x * 2`, not from a: no module produced it
    assert by_name["b"].inputs == []
    assert by_name["a"].inputs == []


class _Siblings(nn.Module):
    """Three layers on an input that needs no grad: in the backward, none of them is
    left (its input gradient never comes), so all three are open at once."""

    def __init__(self) -> None:
        super().__init__()
        self.z, self.y, self.x = nn.Linear(4, 8), nn.Linear(4, 16), nn.Linear(4, 32)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.z(inp), self.y(inp), self.x(inp)], -1)


def test_backward_flops_go_to_the_layer_whose_backward_runs() -> None:
    """By hand: each layer's weight gradient is one [out, 2] @ [2, 4] matmul, 2 x 2 x 4 x out
    FLOPs. The tie among open layers went by the set's string hashes, which change with
    each process: any of the three could take another's."""
    from inspector.context import Inputs
    from inspector.graph.backward import measure_backward

    total, per_module = measure_backward(_Siblings(), Inputs((torch.randn(2, 4),), {}), None)
    assert (per_module["z"], per_module["y"], per_module["x"]) == (128, 256, 512)
    assert total == per_module[""] == 896


def test_allocated_bytes_counts_each_new_storage_once() -> None:
    from inspector.graph.allocated import AllocatedBytes

    x = torch.randn(4, 8)
    with AllocatedBytes() as counted:
        a = x * 2  # new: 4 x 8 float32, 128 B
        v = a.view(8, 4)  # a view of a: nothing
        a.add_(1)  # in place: nothing
        c = torch.cat([a, v.reshape(4, 8)])  # the reshape is a view; the cat 256 B
        c.max(dim=1)  # values (8 float32) and indices (8 int64): 32 + 64 B
    assert counted.total == 128 + 256 + 32 + 64


def test_a_graph_of_module_calls_is_bounded_by_what_its_run_allocated() -> None:
    """The hooks capture shows module calls, not the ops between them (`h.sum() > 0`,
    the relu): what its run allocated op by op bounds a step before the memory pass."""
    from inspector.memory import rough

    torch.manual_seed(0)
    ctx = make_ctx(*MODELS["data_dependent"], {"B": 4})
    inspect_ctx(ctx)
    assert ctx.capture.method == "hooks"
    x = ctx.inputs.args[0]
    relu = bool(ctx.model.a(x).sum() > 0)
    # a's output, h.sum(), the comparison, relu's output where it ran, b's output
    expected = 4 * 8 * 4 + 4 + 1 + (4 * 8 * 4 if relu else 0) + 4 * 4 * 4
    assert ctx.capture.allocated_bytes == expected
    weights = (8 * 8 + 8 + 8 * 4 + 4) * 4
    bounds = rough.step_bytes(ctx)
    assert bounds is not None
    assert bounds.forward_peak == weights + 4 * 8 * 4 + expected
    assert bounds.saved == 4 * 8 * 4 + 3 * expected
    # AdamW: gradients, two moments and a step counter for each of the four parameters,
    # temporaries of 2 x gradients
    grads = weights
    assert (
        bounds.train_peak
        == weights + grads + 2 * grads + 4 * 4 + bounds.saved + expected + 2 * grads
    )


def test_the_forward_only_flop_counter_still_counts_by_module() -> None:
    from inspector.graph.flops import forward_flop_counter

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    counter = forward_flop_counter()
    with torch.no_grad(), counter:
        model(torch.randn(3, 4))
    by_module = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    # 2 FLOPs x 3 rows x in x out, per Linear
    assert by_module == {"Global": 288, "Sequential": 288, "Sequential.0": 192, "Sequential.2": 96}
