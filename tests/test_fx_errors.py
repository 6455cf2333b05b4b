"""fx's cryptic failures explained: what fx could not trace, and where.

A forward wrapped by a `(*args, **kwargs)` decorator (transformers' `can_return_tuple`)
makes `symbolic_trace` fail with "code: co_varnames is too small"; the report says which
decorators and which forward, and what stopped the guided trace after it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from torch import nn

from inspector.analyze import inspect_model
from inspector.context import Options
from inspector.graph.fxcapture import trace_fx
from inspector.graph.fxerrors import FxTraceError

MODELS = Path(__file__).parent / "hf_tiny_models.py"


def passes_through(fn):  # noqa: ANN001, ANN201 - a decorator as libraries write them
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        return fn(self, *args, **kwargs)

    return wrapper


class Decorated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    # more parameters than the wrapper has local names, and **kwargs, as HF forwards have
    @passes_through
    def forward(self, x, mask=None, ids=None, scale=1.0, bias=0.0, **kwargs):  # noqa: ANN001, ANN003, ANN201
        return self.lin(x) * scale + bias


def _line_of(text: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.lstrip().startswith(text))


def test_torch_fails_cryptically_on_a_decorated_forward():
    with pytest.raises(ValueError, match="co_varnames is too small"):
        torch.fx.symbolic_trace(Decorated())


def test_the_decorator_and_the_forward_are_named():
    with pytest.raises(FxTraceError) as caught:
        trace_fx(Decorated(), (torch.randn(3, 4),), {})
    text = str(caught.value)
    wrapper_line = _line_of("def wrapper(self, *args, **kwargs):")
    forward_line = _line_of("def forward(self, x, mask=None")
    assert f"Decorated.forward (test_fx_errors.py:{forward_line})" in text
    assert f"`passes_through` (test_fx_errors.py:{wrapper_line})" in text
    assert caught.value.error_type == "ValueError"  # fx's own error, to look up


def test_bart_capture_explains_fx_and_keeps_export_as_info():
    from hf_tiny_models import token_spec

    options = Options(fake=True, passes={"findings"}, export="none")
    report = inspect_model(f"{MODELS}:bart", token_spec(seq=16), options)
    fx, export = report.capture.attempts
    assert not fx.ok and export.ok and report.capture.method == "export"
    assert "BartForConditionalGeneration.forward (transformers/models/bart/" in fx.error
    assert "`can_return_tuple` (transformers/utils/generic.py:" in fx.error
    # what stopped the guided trace, at BART's `shift_tokens_right`
    assert "item assignment (`x[...] = ...`) on a traced tensor, at " in fx.error
    assert "shifted_input_ids[:, 1:] = input_ids[:, :-1].clone()" in fx.error
    (capture,) = [f for f in report.findings if f.rule == "capture-failed"]
    assert capture.severity == "info" and "export was used instead" in capture.message
    assert not [f for f in report.findings if f.severity != "info"]
