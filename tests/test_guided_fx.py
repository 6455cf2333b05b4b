"""fx guided by meta values: models plain symbolic_trace cannot trace (Python branches on
traced sizes, Hugging Face models) still get an fx graph, checked against an independent
capture (torch.export) and against the model's own output."""

from __future__ import annotations

import math
from pathlib import Path

import models
import pytest
import torch
from graph_helpers import inspect_ctx, make_ctx
from torch import nn

from inspector import capture
from inspector.graph.guidedfx import GuidedTraceError, trace_guided
from inspector.graph.metarun import on_meta_device
from inspector.passes import graph
from inspector.report import Report

THIS = str(Path(__file__))


class ShapeBranch(nn.Module):
    """Plain fx fails at the `if` (a Proxy has no truth value); the branch follows T."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(8, 16)
        self.narrow = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, 8]
        y = self.wide(x) if x.shape[1] > 3 else self.narrow(x)
        return y.flatten(1)


class StableBranches(nn.Module):
    """Decisions no named dim changes: a rank test and a scale from a fixed width."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, 8]
        if x.dim() == 3:
            x = x * (1.0 / math.sqrt(x.size(-1)))
        h = self.proj(x)
        return h.view(x.size(0), -1)


class BranchThenNonzero(nn.Module):
    """Plain fx fails at the `if`; meta cannot size `nonzero`: torch.export is next."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > 3:
            x = x * 2
        h = self.lin(x)
        return h[torch.nonzero(h.sum(-1) > -1e9, as_tuple=True)]


class _RotateHalf(nn.Module):
    """A function wrapped as a module, as the `kernels` package wraps transformers'
    `apply_rotary_pos_emb`: one instance at module level, held by no model."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


rotate_half = _RotateHalf()


class CallsAHeldByNoOne(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rotate_half(self.proj(x)) * 2


class BranchThenHeldByNoOne(CallsAHeldByNoOne):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > 3:  # plain fx fails here, guided fx goes on
            x = x + 1
        return rotate_half(self.proj(x))


def _run(module: type[nn.Module], fake: bool = False, **dims: int):
    make = lambda B, T: ((torch.randn(B, T, 8),), {})  # noqa: E731, N803
    ctx = make_ctx(module, make, dims, fake=fake, user_files=(THIS,))
    return ctx, inspect_ctx(ctx)


@pytest.mark.parametrize("fake", [False, True])
def test_a_branch_on_a_size_traces_with_that_dim_left_concrete(fake: bool) -> None:
    ctx, report = _run(ShapeBranch, fake=fake, B=4, T=6)
    (attempt,) = report.capture.attempts
    assert attempt.method == "fx" and attempt.ok
    assert "symbolic_trace failed" in attempt.error and "TraceError" in attempt.error
    assert report.capture.method == "fx"
    # T=6 takes the wide branch: Linear(8, 16) on B*T rows, 2 * 4*6 * 8 * 16 FLOPs
    assert report.module("wide").flops_forward == 2 * 4 * 6 * 8 * 16
    assert report.module("narrow").flops_forward == 0
    # with T halved to 3 the `if` goes the other way: T is not symbolic, B is
    out = report.module("").output_shapes[0]
    assert out == ["B", 96]  # flatten of [B, 6, 16]
    (warning,) = [w for w in report.meta.warnings if "Python decision" in w]
    line = ShapeBranch.forward.__code__.co_firstlineno + 1  # the `if` on x.shape[1]
    assert f"changes with T (`gt` at test_guided_fx.py:{line})" in warning


def test_decisions_no_dim_moves_keep_every_dim_symbolic() -> None:
    ctx, report = _run(StableBranches, B=4, T=6)
    (attempt,) = report.capture.attempts
    assert attempt.ok and report.capture.method == "fx"
    assert report.module("").output_shapes == [["B", "8*T"]]
    assert report.module("proj").output_shapes == [["B", "T", 8]]
    assert report.module("proj").flops_forward == 2 * 4 * 6 * 8 * 8
    assert not any("branch" in w for w in report.meta.warnings)
    # the graph computes what the model computes
    x = torch.randn(3, 5, 8)
    (out,) = ctx.capture.graph_module(x)
    torch.testing.assert_close(out, ctx.model(x))


def test_the_terminal_says_how_fx_got_round_the_failure() -> None:
    import io

    from rich.console import Console

    from inspector.render.terminal import render_terminal

    _, report = _run(StableBranches, B=4, T=6)
    buffer = io.StringIO()
    render_terminal(report, console=Console(file=buffer, width=300))
    out = buffer.getvalue()
    assert "capture fx" in out and "fx: torch.fx.symbolic_trace failed (TraceError" in out
    # `x.dim() == 3`; math.sqrt of a traced size is a node (fx wraps the math module)
    assert "1 Python decision on traced values" in out


def test_what_meta_cannot_run_goes_on_to_export() -> None:
    _, report = _run(BranchThenNonzero, B=4, T=6)
    fx, export = report.capture.attempts
    assert not fx.ok and fx.error_type == "TraceError"  # plain fx's error, the user's line
    assert fx.source_line == "if x.shape[1] > 3:"
    assert export.ok and report.capture.method == "export"
    assert report.module("lin").flops_forward == 2 * 4 * 6 * 8 * 8


@pytest.mark.parametrize("module", [CallsAHeldByNoOne, BranchThenHeldByNoOne])
def test_a_module_the_model_does_not_hold_is_traced_as_a_function(module) -> None:
    """fx names a called module by its path in the model; one held by no model has none,
    and fx's own tracer stops ("module is not installed as a submodule")."""
    ctx, report = _run(module, B=4, T=6)
    assert report.capture.method == "fx" and report.capture.attempts[-1].ok
    # its ops are the caller's: neg and cat on the root, nothing named after the wrapper
    ops = {n.target: n.module_path for n in report.nodes if n.op == "call_function"}
    assert ops["torch.cat"] == "" and "_operator.neg" in ops
    assert [m.path for m in report.modules] == ["", "proj"]
    x = torch.randn(3, 5, 8)
    out = ctx.capture.graph_module(x)  # guided fx returns the flat outputs
    out = out[0] if isinstance(out, tuple) else out
    torch.testing.assert_close(out, ctx.model(x))


def test_control_flow_on_tensor_data_is_refused() -> None:
    model, (args, kwargs) = models.make_data_dependent()
    with pytest.raises(GuidedTraceError, match="control flow on tensor data"):
        trace_guided(model, args, kwargs)


class DuckTyped(nn.Module):
    """Duck typing on the input, as transformers' `is_jax_jitting` does: eager sees a
    tensor without a `jax` attribute, and `.item()` under `try` works on real values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(x, "jax"):  # plain fx says True to any attribute
            x = x * 2
        if x.shape[0] > 1:  # plain fx stops here
            x = x + 1
        return x


class CaughtItem(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            scale = x.max().item()  # meta has no value: the model would take the except
        except Exception:  # noqa: BLE001
            scale = 1.0
        return x * scale if x.shape[0] > 1 else x


def test_attributes_a_tensor_lacks_are_missing_as_in_eager() -> None:
    x = torch.randn(3, 4)
    cap = trace_guided(DuckTyped(), (x,), {})
    (out,) = cap.graph_module(x)
    torch.testing.assert_close(out, x + 1)
    assert not [n for n in cap.graph_module.graph.nodes if "jax" in n.name]


def test_a_meta_failure_the_model_catches_still_refuses_the_trace() -> None:
    with pytest.raises(GuidedTraceError, match="does not run on meta tensors"):
        trace_guided(CaughtItem(), (torch.randn(3, 4),), {})


def test_placeholders_are_the_flat_input_tensors_named_after_them() -> None:
    model, (args, kwargs) = models.make_dict_in_tuple_out()
    cap = trace_guided(model, args, kwargs)
    names = [n.name for n in cap.graph_module.graph.find_nodes(op="placeholder")]
    assert names == ["batch_image", "batch_tokens"]
    out = cap.graph_module(args[0]["image"], args[0]["tokens"])
    for got, want in zip(out, model(*args), strict=True):
        torch.testing.assert_close(got, want)
    # targets are the model's own paths, as plain fx names them
    assert {n.target for n in cap.graph_module.graph.find_nodes(op="call_module")} == {
        "image",
        "text",
    }


def test_devices_baked_into_a_call_move_to_meta() -> None:
    cpu = torch.device("cpu")
    args, kwargs = on_meta_device("to", (object(), "cpu"), {"device": cpu, "x": "cpu"}, cpu)
    assert args[1] == torch.device("meta")
    assert kwargs == {"device": torch.device("meta"), "x": "cpu"}  # only device arguments
    args, _ = on_meta_device(None, ("cpu", torch.device("cuda")), {}, cpu)
    assert args == ("cpu", torch.device("cuda"))


@pytest.fixture(scope="module")
def gpt2_both() -> tuple:
    """GPT-2 small (2 layers) captured by guided fx and by torch.export."""
    cfg = {"n_layer": 2, "vocab_size": 100, "n_positions": 64}

    def build() -> nn.Module:
        return models.make_gpt2(**cfg)[0]

    def ids(B: int, S: int) -> tuple:  # noqa: N803
        return (), {"input_ids": torch.randint(0, 100, (B, S))}

    guided_ctx = make_ctx(build, ids, {"B": 2, "S": 8})
    guided = inspect_ctx(guided_ctx)
    export_ctx = make_ctx(build, ids, {"B": 2, "S": 8})
    result, _ = capture._export(export_ctx)  # the independent capture
    result.attempts = []
    export_ctx.capture = result
    graph.run(export_ctx)
    return guided_ctx, guided, export_ctx.report


def test_gpt2_plain_fx_fails_and_guided_fx_traces_it(gpt2_both: tuple) -> None:
    ctx, report, _ = gpt2_both
    (attempt,) = report.capture.attempts
    assert attempt.ok and report.capture.method == "fx"
    assert "co_varnames" in attempt.error  # why plain symbolic_trace failed
    assert report.module("").output_shapes[0] == ["B", "S", 100]
    # the graph gives the model's own logits
    ids = torch.randint(0, 100, (3, 5))
    with torch.no_grad():
        logits = ctx.capture.graph_module(ids)[0]
        torch.testing.assert_close(logits, ctx.model(input_ids=ids).logits)


def test_gpt2_guided_fx_agrees_with_torch_export(gpt2_both: tuple) -> None:
    _, guided, exported = gpt2_both
    _assert_agree(guided, exported, same_outputs=True)


def _assert_agree(guided: Report, exported: Report, same_outputs: bool) -> None:
    assert exported.nodes  # export ran the graph pass
    g, e = guided.totals, exported.totals
    assert (g.params, g.flops_forward, g.flops_backward) == (
        e.params,
        e.flops_forward,
        e.flops_backward,
    )
    by_path = {m.path: m for m in exported.modules}
    for m in guided.modules:
        other = by_path[m.path]
        assert (m.flops_forward, m.flops_backward) == (other.flops_forward, other.flops_backward)
        if same_outputs:
            assert m.output_shapes == other.output_shapes, m.path
    assert guided.module("").output_shapes[0] == exported.module("").output_shapes[0]


def _hf(name: str) -> nn.Module:
    import transformers as hf

    small = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "vocab_size": 100}  # fmt: skip
    if name == "llama":
        return hf.LlamaForCausalLM(hf.LlamaConfig(**small, num_key_value_heads=2)).eval()
    return hf.BertModel(hf.BertConfig(**small)).eval()


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_other_hugging_face_models_agree_with_torch_export(name: str) -> None:
    """Llama (RMSNorm, rotary, grouped KV) and BERT (buffers sliced by the traced length)."""

    def ids(B: int, S: int) -> tuple:  # noqa: N803
        return (), {"input_ids": torch.randint(0, 100, (B, S))}

    torch.manual_seed(0)
    ctx = make_ctx(lambda: _hf(name), ids, {"B": 2, "S": 8})
    guided = inspect_ctx(ctx)
    assert guided.capture.method == "fx" and not ctx.capture.fx_leaves
    assert not guided.meta.warnings  # every dim symbolic: no decision moved with B or S
    export_ctx = make_ctx(lambda: _hf(name), ids, {"B": 2, "S": 8})
    export_ctx.capture, _ = capture._export(export_ctx)
    graph.run(export_ctx)
    # module outputs differ in one respect: export also counts RMSNorm's float32 copy
    _assert_agree(guided, export_ctx.report, same_outputs=name == "bert")


class SlicedBuffer(nn.Module):
    """A buffer sliced by a traced length (as BERT's position ids): a graph op, not a
    decision taken at the example's length."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("ids", torch.arange(16).unsqueeze(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape  # plain fx cannot unpack a Proxy
        return self.ids[:, :s].expand(b, s) + x


def test_a_buffer_sliced_by_a_traced_length_stays_symbolic() -> None:
    make = lambda B, S: ((torch.zeros(B, S, dtype=torch.long),), {})  # noqa: E731, N803
    ctx = make_ctx(SlicedBuffer, make, {"B": 2, "S": 6}, user_files=(THIS,))
    report = inspect_ctx(ctx)
    assert report.capture.method == "fx" and not report.meta.warnings
    assert report.module("").output_shapes == [["B", "S"]]
    (out,) = ctx.capture.graph_module(torch.zeros(3, 5, dtype=torch.long))
    torch.testing.assert_close(out, torch.arange(5).expand(3, 5))
