"""The upload API and the library agree on every input spec: the same generated specs, valid
and invalid, are refused by both with the same message, or accepted by both.

The library side runs `inspector.inputspec.parse_input` against a model whose `forward`
takes anything and whose own inputs have every dim name the generator uses, so only the
grammar can refuse; the API side is a real upload through the ASGI app.
"""

from __future__ import annotations

import json

import pytest
import torch
from api_support import api_env, upload
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from inspector.context import LoadedModel
from inspector.errors import InputSpecError
from inspector.inputspec import SpecFactory, TensorSpec, parse_input

DIM_NAMES = ["B", "S", "T", "_h", "2B", "", "B S"]
GOOD_DIMS = [n for n in DIM_NAMES if n.isidentifier()]
DTYPE_NAMES = ["float32", "fp16", "bf16", "torch.long", "int8", "uint8", "bool", "complex64", 7]


class AnyInputs(nn.Module):
    def forward(self, *args: object, **kwargs: object) -> None:
        return None


def _own_inputs() -> SpecFactory:
    spec = TensorSpec(tuple(GOOD_DIMS), torch.float32, low=None, high=None, where="x")
    return SpecFactory((), {"x": spec}, dict.fromkeys(GOOD_DIMS, 2), spec="own")


LOADED = LoadedModel(AnyInputs(), "python", "m.py:AnyInputs", inputs=_own_inputs())

sizes = st.one_of(st.integers(-2, 9), st.sampled_from(DIM_NAMES), st.just(2.5), st.none())
bounds = st.one_of(st.none(), st.integers(-300, 300), st.floats(-2, 2), st.just("1"))
tensor = st.fixed_dictionaries(
    {"shape": st.lists(sizes, max_size=4)},
    optional={
        "dtype": st.sampled_from(DTYPE_NAMES),
        "low": bounds,
        "high": bounds,
        "dtpye": st.just("int64"),
    },
)
leaf = st.one_of(tensor, st.integers(-3, 3), st.lists(st.integers(1, 9), min_size=1, max_size=3))
inputs = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abc"), inner, max_size=2)
    ),
    max_leaves=4,
)
dims = st.dictionaries(st.sampled_from(DIM_NAMES), st.one_of(st.integers(-1, 9), st.just("4")))
keyword_spec = st.builds(
    lambda named, d: {**named, **({"dims": d} if d is not None else {})},
    st.dictionaries(st.sampled_from(["x", "ids", "mask"]), inputs, min_size=1, max_size=3),
    st.one_of(st.none(), dims),
)
spec = st.one_of(
    keyword_spec,
    st.lists(inputs, max_size=3),
    st.builds(lambda d: {"dims": d}, dims),
    st.sampled_from(["x", 3, None]),
)


def library_verdict(text: str) -> str | None:
    try:
        parse_input(text, LOADED)
    except InputSpecError as exc:
        return exc.message
    return None


def api_verdict(env, text: str) -> str | None:
    response = upload(env, data={"input": text})
    if response.status_code == 201:
        return None
    assert response.status_code == 422, response.text
    return response.json()["error"]["message"].removeprefix("input spec: ")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    with api_env("sqlite", tmp_path_factory.mktemp("agree"), monkeypatch) as env:
        yield env
    monkeypatch.undo()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=spec)
def test_api_and_library_agree_on_generated_specs(env, spec) -> None:
    text = json.dumps(spec)
    assert api_verdict(env, text) == library_verdict(text), text


@pytest.mark.parametrize(
    "text",
    [
        '{"x": {"shape": [2, 8], "dtype": "complex64"}}',
        '{"x": {"shape": ["2B", 8]}, "dims": {"2B": 2}}',
        '{"x": {"shape": [2, 8], "dtpye": "int64"}}',
        '{"x": {"shape": [-2, 8]}}',
    ],
)
def test_the_issue_specs_are_refused_by_both_with_one_message(env, text: str) -> None:
    message = library_verdict(text)
    assert message is not None
    assert api_verdict(env, text) == message
