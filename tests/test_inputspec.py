"""The input spec: parsing, building (real and fake), tensor files, and every InputSpecError."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from models import MLP, DictInTupleOut, EmbeddingBag, ResNet18
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from inspector.context import LoadedModel
from inspector.errors import InputSpecError
from inspector.inputspec import DTYPES, SpecFactory, parse_dtype, parse_input


def loaded(model: nn.Module, inputs=None) -> LoadedModel:
    return LoadedModel(model=model, source_kind="python", source_name="m.py:Net", inputs=inputs)


class TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, ids: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x.sum() * scale + ids.sum()


# --- parsing and building -----------------------------------------------------------------


def test_keyword_spec_with_dims() -> None:
    spec = '{"x": {"shape": ["B", 3, 224, 224]}, "dims": {"B": 2}}'
    factory = parse_input(spec, loaded(ResNet18()))
    inputs = factory.build()
    assert inputs.args == () and inputs.kwargs["x"].shape == (2, 3, 224, 224)
    assert inputs.kwargs["x"].dtype == torch.float32
    assert inputs.dims == {"B": 2} and factory.batch_dim == "B"
    assert factory.spec == json.loads(spec)


def test_build_with_other_dims_and_only_used_dims_reported() -> None:
    spec = '{"x": {"shape": ["N", 784]}, "dims": {"N": 4, "unused": 7}}'
    factory = parse_input(spec, loaded(MLP()))
    inputs = factory.build({"N": 3})
    assert inputs.kwargs["x"].shape == (3, 784) and inputs.dims == {"N": 3}
    assert factory.batch_dim == "N"  # first dim of the first tensor, named


def test_positional_spec_and_int_range() -> None:
    spec = '[{"shape": [8, 16]}, {"shape": [8, 4], "dtype": "int64", "high": 10}]'
    factory = parse_input(spec, loaded(TwoInputs()))
    x, ids = factory.build().args
    assert x.shape == (8, 16) and x.dtype == torch.float32
    assert ids.shape == (8, 4) and ids.dtype == torch.int64
    assert int(ids.min()) >= 0 and int(ids.max()) < 10
    assert factory.batch_dim is None


def test_int_values_cover_exactly_low_to_high() -> None:
    spec = '{"ids": {"shape": [10000], "dtype": "int32", "low": 5, "high": 9}, "x": {"shape": [1]}}'
    ids = parse_input(spec, loaded(TwoInputs())).build().kwargs["ids"]
    assert ids.dtype == torch.int32
    # 10,000 draws from {5, 6, 7, 8}: every value shows up, nothing outside.
    assert sorted(ids.unique().tolist()) == [5, 6, 7, 8]


def test_float_bounds_give_uniform_values_and_bool_is_zero_one() -> None:
    spec = '[{"shape": [5000], "low": -2, "high": -1.5}, {"shape": [5000], "dtype": "bool"}]'
    x, mask = parse_input(spec, loaded(TwoInputs())).build().args
    assert float(x.min()) >= -2 and float(x.max()) < -1.5
    assert mask.dtype == torch.bool and 0 < int(mask.sum()) < 5000


def test_scalars_pass_through() -> None:
    spec = '{"x": {"shape": [2]}, "ids": {"shape": [2], "dtype": "long"}, "scale": 0.5}'
    inputs = parse_input(spec, loaded(TwoInputs())).build()
    assert inputs.kwargs["scale"] == 0.5


def test_nested_dict_input_runs_the_model() -> None:
    spec = {
        "batch": {
            "image": {"shape": ["B", 16]},
            "tokens": {"shape": ["B", 5], "dtype": "int64", "high": 100},
        },
        "dims": {"B": 3},
    }
    inputs = parse_input(json.dumps(spec), loaded(DictInTupleOut())).build()
    out = inputs.call(DictInTupleOut())
    assert [o.shape for o in out] == [(3, 8), (3, 8)]


def test_nested_tuple_input() -> None:
    spec = '[[{"shape": [2, 3]}, {"shape": [4]}]]'
    (pair,) = parse_input(spec, loaded(TwoInputsTuple())).build().args
    assert isinstance(pair, tuple) and [t.shape for t in pair] == [(2, 3), (4,)]


class TwoInputsTuple(nn.Module):
    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return pair[0].sum() + pair[1].sum()


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("float32", torch.float32), ("float", torch.float32), ("fp32", torch.float32),
        ("float16", torch.float16), ("half", torch.float16), ("fp16", torch.float16),
        ("bfloat16", torch.bfloat16), ("bf16", torch.bfloat16), ("float64", torch.float64),
        ("int64", torch.int64), ("long", torch.int64), ("int32", torch.int32),
        ("int8", torch.int8), ("uint8", torch.uint8), ("bool", torch.bool),
        ("torch.float16", torch.float16),
    ],
)  # fmt: skip
def test_dtype_names(name: str, dtype: torch.dtype) -> None:
    assert parse_dtype(name) == dtype
    spec = json.dumps([{"shape": [2], "dtype": name}])
    assert parse_input(spec, loaded(TwoInputsTuple())).build().args[0].dtype == dtype


def test_fake_build_gives_fake_tensors_of_the_same_shapes() -> None:
    factory = parse_input(
        '{"x": {"shape": ["B", 16]}, "ids": {"shape": ["B", 4], "dtype": "int64", "high": 10},'
        ' "dims": {"B": 6}}',
        loaded(TwoInputs()),
    )
    real = factory.build()
    with FakeTensorMode():
        fake = factory.build()
    assert all(isinstance(t, FakeTensor) for t in fake.tensors())
    assert not any(isinstance(t, FakeTensor) for t in real.tensors())
    assert [(t.shape, t.dtype) for t in fake.tensors()] == [
        (t.shape, t.dtype) for t in real.tensors()
    ]
    assert fake.dims == real.dims == {"B": 6}


def test_build_follows_the_global_seed() -> None:
    factory = parse_input('[{"shape": [4]}]', loaded(TwoInputsTuple()))
    torch.manual_seed(3)
    first = factory.build().args[0]
    torch.manual_seed(3)
    assert torch.equal(first, factory.build().args[0])


def test_dims_only_spec_overrides_the_models_own_inputs() -> None:
    own = SpecFactory((), {"ids": _ids_spec()}, {"B": 2, "S": 8}, spec="preset")
    factory = parse_input('{"dims": {"S": 32}}', loaded(EmbeddingBag(), inputs=own))
    inputs = factory.build()
    assert inputs.kwargs["ids"].shape == (2, 32) and inputs.dims == {"B": 2, "S": 32}
    assert factory.build({"B": 5}).kwargs["ids"].shape == (5, 32)
    assert factory.batch_dim == "B"


def _ids_spec():
    return parse_input(
        '{"ids": {"shape": ["B", "S"], "dtype": "int64", "high": 1000}, "dims": {"B": 1, "S": 1}}',
        loaded(EmbeddingBag()),
    ).kwargs["ids"]


def test_none_uses_the_models_own_inputs() -> None:
    own = SpecFactory((), {}, {}, spec=None)
    assert parse_input(None, loaded(MLP(), inputs=own)) is own


def test_spec_from_a_json_file(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text('{"x": {"shape": [2, 784]}}')
    assert parse_input(str(path), loaded(MLP())).build().kwargs["x"].shape == (2, 784)


# --- tensor files -------------------------------------------------------------------------


def test_pt_file_round_trip(tmp_path: Path) -> None:
    x, ids = torch.randn(2, 3), torch.arange(6).reshape(2, 3)
    torch.save({"x": x, "ids": ids}, tmp_path / "kw.pt")
    inputs = parse_input(str(tmp_path / "kw.pt"), loaded(TwoInputs())).build()
    assert torch.equal(inputs.kwargs["x"], x) and torch.equal(inputs.kwargs["ids"], ids)
    torch.save((x, ids), tmp_path / "pos.pth")
    inputs = parse_input(str(tmp_path / "pos.pth"), loaded(TwoInputs())).build()
    assert torch.equal(inputs.args[1], ids)


def test_pt_dict_with_other_keys_is_one_dict_argument(tmp_path: Path) -> None:
    batch = {"image": torch.randn(4, 16), "tokens": torch.randint(0, 100, (4, 5))}
    torch.save(batch, tmp_path / "batch.pt")
    inputs = parse_input(str(tmp_path / "batch.pt"), loaded(DictInTupleOut())).build()
    assert inputs.kwargs == {} and torch.equal(inputs.args[0]["image"], batch["image"])


def test_safetensors_round_trip(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    x = torch.randn(3, 784)
    save_file({"x": x}, str(tmp_path / "in.safetensors"))
    factory = parse_input(str(tmp_path / "in.safetensors"), loaded(MLP()))
    assert torch.equal(factory.build().kwargs["x"], x)
    with FakeTensorMode():
        assert isinstance(factory.build().kwargs["x"], FakeTensor)


class _Malicious:
    """Unpickling this creates `path`: stands for any code a pickle can run."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_malicious_pickle_is_refused_and_does_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Malicious(marker))
    pickle.loads(payload)  # control: a plain unpickle runs the payload
    assert marker.exists()
    marker.unlink()
    for name in ("evil.pt", "evil_zip.pth"):
        path = tmp_path / name
        if name == "evil.pt":
            path.write_bytes(payload)  # a raw pickle
        else:
            torch.save({"x": _Malicious(marker)}, path)  # torch.save's zip format
        with pytest.raises(InputSpecError, match="refused: it holds objects other than tensors"):
            parse_input(str(path), loaded(MLP()))
        assert not marker.exists()


def test_missing_tensor_file(tmp_path: Path) -> None:
    with pytest.raises(InputSpecError, match="input file not found"):
        parse_input(str(tmp_path / "nope.pt"), loaded(MLP()))


# --- errors -------------------------------------------------------------------------------


def _error(spec: str, model: nn.Module | None = None) -> str:
    with pytest.raises(InputSpecError) as info:
        parse_input(spec, loaded(model or TwoInputs()))
    return str(info.value)


def test_bad_json_gives_line_and_column() -> None:
    text = _error('{"x": {"shape": [2]},\n "ids": {"shape": [2]] }')
    assert "line 2, column 22" in text and 'ids": {"shape": [2]]' in text


def test_unknown_dtype_lists_the_known_ones() -> None:
    text = _error('{"x": {"shape": [2], "dtype": "float33"}, "ids": {"shape": [2]}}')
    assert 'x: unknown dtype "float33"' in text and "bf16" in text


def test_dim_without_value_says_how_to_add_it() -> None:
    text = _error('{"x": {"shape": ["B", "S"]}, "ids": {"shape": [2]}, "dims": {"B": 2}}')
    assert "dim 'S' in the shape of x has no value" in text
    assert '"dims": {"B": 2, "S": 8}' in text


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ('[{"shape": [2, 0]}]', "shape entry 0 must be a positive size"),
        ('[{"shape": [-3]}]', "shape entry -3 must be a positive size"),
        ('{"x": {"shape": ["B"]}, "dims": {"B": "4"}}', 'dim \'B\' in "dims" is "4"'),
        ('{"x": {"shape": ["B"]}, "dims": {"B": 0}}', 'dim \'B\' in "dims" is 0'),
        ('[{"shape": [2.5]}]', "shape entry 2.5 must be a positive integer"),
        ('[{"shape": ["2B"]}]', "'2B' is not a dim name"),
        ('[{"shape": [2], "shap": 1}]', "unknown key 'shap'"),
        ('[{"shape": [2], "dtype": "int64", "low": 5, "high": 5}]', "must be below"),
        ('[{"shape": [2], "dtype": "int8", "high": 1000}]', "do not fit int8"),
        ('[{"shape": [2], "dtype": "int64", "high": 2.5}]', '"high" must be an integer'),
        ('"x"', "must be a JSON object or list"),
    ],
)  # fmt: skip
def test_bad_values(spec: str, needle: str) -> None:
    assert needle in _error(spec)


def test_unknown_keyword_lists_forward_parameters() -> None:
    text = _error('{"x": {"shape": [2]}, "idz": {"shape": [2]}}')
    assert "input 'idz' is not a parameter of TwoInputs.forward(x, ids, scale)" in text
    assert "x, ids, scale" in text


def test_missing_required_parameter() -> None:
    text = _error('{"x": {"shape": [2]}}')
    assert "missing input 'ids': a required parameter of TwoInputs.forward" in text


def test_too_many_positional_inputs() -> None:
    text = _error('[{"shape": [2]}, {"shape": [2]}, {"shape": [2]}, {"shape": [2]}]')
    assert "gives 4 positional inputs but TwoInputs.forward(x, ids, scale) takes 3" in text


def test_no_spec_and_no_example_suggests_one_from_the_first_layer() -> None:
    with pytest.raises(InputSpecError) as info:
        parse_input(None, loaded(ResNet18()))
    text = str(info.value)
    assert "--input" in text and '"x": {"shape": ["B", 3, 224, 224]}' in text
    with pytest.raises(InputSpecError) as info:
        parse_input(None, loaded(EmbeddingBag()))
    assert '"ids": {"shape": ["B", "S"], "dtype": "int64", "high": 1000}' in str(info.value)


def test_dims_only_without_named_dims_is_an_error() -> None:
    assert "has no example inputs with named dims" in _error('{"dims": {"B": 4}}')
    own = SpecFactory((), {"ids": _ids_spec()}, {"B": 2, "S": 8}, spec="preset")
    with pytest.raises(InputSpecError, match=r"dim 'T' is not a dim of .*\(its dims: B, S\)"):
        parse_input('{"dims": {"T": 4}}', loaded(EmbeddingBag(), inputs=own))


def test_neither_json_nor_file() -> None:
    assert "neither a JSON input spec nor a tensor file" in _error("x=3")


def test_every_dtype_name_listed_parses() -> None:
    assert all(parse_dtype(name) == dtype for name, dtype in DTYPES.items())
