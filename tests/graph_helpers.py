"""Build a pipeline Context straight from test models (no loader, no input spec)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import models
from torch import nn

from inspector.capture import capture_graph
from inspector.context import Context, InputFactory, Inputs, LoadedModel, Options
from inspector.graph.lenient import new_fake_mode
from inspector.passes import graph
from inspector.report import Report

MakeInputs = Callable[..., tuple[tuple, dict]]


class FnFactory(InputFactory):
    """Inputs from `make(**dims) -> (args, kwargs)`; fake when built under a fake mode."""

    def __init__(self, make: MakeInputs, dims: dict[str, int]) -> None:
        super().__init__(dims)
        self.make = make

    def build(self, dims: dict[str, int] | None = None, device: str = "cpu") -> Inputs:
        values = {**self.dims, **(dims or {})}
        args, kwargs = self.make(**values)
        return Inputs(args, kwargs, values)


def make_ctx(
    build: Callable[[], nn.Module],
    make_inputs: MakeInputs,
    dims: dict[str, int] | None = None,
    *,
    fake: bool = False,
    user_files: tuple[str, ...] = (models.__file__,),
) -> Context:
    fake_mode = new_fake_mode() if fake else None
    with fake_mode or nullcontext():
        model = build()
        factory = FnFactory(make_inputs, dims or {})
        inputs = factory.build()
    loaded = LoadedModel(model, "python", "models.py", user_files=list(user_files))
    return Context(loaded, factory, inputs, Options(fake=fake), Report(), fake_mode=fake_mode)


def inspect_ctx(ctx: Context) -> Report:
    """capture + the graph pass, as `inspect_model` runs them."""
    ctx.capture = capture_graph(ctx)
    ctx.report.capture.method = ctx.capture.method
    ctx.report.capture.attempts = ctx.capture.attempts
    graph.run(ctx)
    ctx.report.capture.node_count = len(ctx.report.nodes)
    return ctx.report


def run_model(name: str, fake: bool = False, **dims: int) -> Report:
    """A model of tests/models.py by name, its inputs rebuilt at `dims`."""
    return inspect_ctx(make_ctx(*MODELS[name], dims, fake=fake))


def _model_of(make: Callable[..., Any], **kw: Any) -> Callable[[], nn.Module]:
    return lambda: make(**kw)[0]


def _inputs_of(make: Callable[..., Any], **fixed: Any) -> MakeInputs:
    def inputs(**dims: int) -> tuple[tuple, dict]:
        return make(**fixed, **_renamed(dims))[1]

    return inputs


def _renamed(dims: dict[str, int]) -> dict[str, int]:
    names = {"B": "batch", "S": "seq", "H": "size"}
    return {names.get(k, k): v for k, v in dims.items()}


GPT2_SMALL_CFG = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100, "n_positions": 64}

# name -> (build the model, make inputs from dims)
MODELS: dict[str, tuple[Callable[[], nn.Module], MakeInputs]] = {
    name: (_model_of(make), _inputs_of(make))
    for name, make in models.ALL.items()
    if name not in ("gpt2", "bert")
}
MODELS["gpt2"] = (
    _model_of(models.make_gpt2, **GPT2_SMALL_CFG),
    _inputs_of(models.make_gpt2, **GPT2_SMALL_CFG),
)
BERT_SMALL_CFG = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
}
MODELS["bert"] = (
    _model_of(models.make_bert, **BERT_SMALL_CFG),
    _inputs_of(models.make_bert, **BERT_SMALL_CFG),
)
