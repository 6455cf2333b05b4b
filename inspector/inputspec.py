"""The input spec: JSON that says which tensors to feed the model, with named dims.

```
{"x": {"shape": ["B", 3, 224, 224]}, "dims": {"B": 32}}          keyword inputs
[{"shape": [8, 16]}, {"shape": [8, 4], "dtype": "int64", "high": 10}]   positional inputs
{"dims": {"B": 64}}                         new dim values for the model's own inputs
```
A tensor is `{"shape": [...], "dtype": ..., "low": ..., "high": ...}`; another object is a
dict input, a list a tuple input, a JSON scalar is passed as is. Integers are drawn from
[low, high) (default [0, 10), bool [0, 2)); floats are randn, or uniform in [low, high)
when a bound is given. Or give a tensor file: `.pt`/`.pth` (weights_only) or `.safetensors`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from inspector.context import InputFactory, Inputs, LoadedModel
from inspector.errors import InputSpecError
from inspector.loaders.signature import check_signature, suggest_spec
from inspector.loaders.tensorfile import TENSOR_SUFFIXES, load_tensor_file

__all__ = ["DTYPES", "TensorSpec", "SpecFactory", "parse_input", "parse_dtype"]

DTYPES: dict[str, torch.dtype] = {
    **dict.fromkeys(("float32", "float", "fp32"), torch.float32),
    **dict.fromkeys(("float16", "half", "fp16"), torch.float16),
    **dict.fromkeys(("bfloat16", "bf16"), torch.bfloat16),
    **dict.fromkeys(("float64", "double", "fp64"), torch.float64),
    **dict.fromkeys(("int64", "long"), torch.int64),
    **dict.fromkeys(("int32", "int"), torch.int32),
    **dict.fromkeys(("int16", "short"), torch.int16),
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_TENSOR_KEYS = {"shape", "dtype", "low", "high"}
_DIM_NAME = re.compile(r"[A-Za-z_]\w*")
_DEFAULT_INT_HIGH = 10


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the spec; `where` names it in messages ("input_ids", "[0]", "batch.x")."""

    shape: tuple[int | str, ...]
    dtype: torch.dtype
    low: float | None
    high: float | None
    where: str

    def make(self, dims: dict[str, int], device: str) -> torch.Tensor:
        """A random tensor; under an active FakeTensorMode the factories make it fake."""
        size = [dims[d] if isinstance(d, str) else d for d in self.shape]
        if self.dtype.is_floating_point:
            if self.low is None and self.high is None:
                return torch.randn(size, dtype=self.dtype, device=device)
            low = 0.0 if self.low is None else self.low
            high = low + 1.0 if self.high is None else self.high
            return torch.rand(size, dtype=self.dtype, device=device) * (high - low) + low
        low = int(self.low or 0)
        high = int(self.high) if self.high is not None else _default_high(self.dtype, low)
        return torch.randint(low, high, size, device=device).to(self.dtype)


def _default_high(dtype: torch.dtype, low: int) -> int:
    return low + (2 if dtype == torch.bool else _DEFAULT_INT_HIGH)


class SpecFactory(InputFactory):
    """Inputs built from a parsed spec: `args`/`kwargs` are trees of TensorSpec."""

    def __init__(self, args: tuple, kwargs: dict, dims: dict[str, int], spec: object) -> None:
        super().__init__(dims=dims, spec=spec)
        self.args, self.kwargs = args, kwargs

    def tensor_specs(self) -> list[TensorSpec]:
        flat, _ = tree_flatten((self.args, self.kwargs))
        return [s for s in flat if isinstance(s, TensorSpec)]

    def used_dims(self) -> list[str]:
        names = (d for s in self.tensor_specs() for d in s.shape if isinstance(d, str))
        return list(dict.fromkeys(names))

    def build(self, dims: dict[str, int] | None = None, device: str = "cpu") -> Inputs:
        values = {**self.dims, **(dims or {})}

        def make(node: Any) -> Any:
            return node.make(values, device) if isinstance(node, TensorSpec) else node

        args, kwargs = tree_map(make, (self.args, self.kwargs))
        return Inputs(tuple(args), dict(kwargs), {d: values[d] for d in self.used_dims()})

    @property
    def batch_dim(self) -> str | None:
        if "B" in self.used_dims():
            return "B"
        specs = self.tensor_specs()
        first = specs[0].shape[0] if specs and specs[0].shape else None
        return first if isinstance(first, str) else None


class DimsOverride(InputFactory):
    """The model's own input factory (a preset's, say) with new values for its dims."""

    def __init__(self, base: InputFactory, dims: dict[str, int], spec: object) -> None:
        super().__init__(dims={**base.dims, **dims}, spec={"base": base.spec, **dict(spec)})
        self.base = base

    def build(self, dims: dict[str, int] | None = None, device: str = "cpu") -> Inputs:
        return self.base.build({**self.dims, **(dims or {})}, device)

    @property
    def batch_dim(self) -> str | None:
        return self.base.batch_dim


def parse_input(text_or_path: str | None, loaded: LoadedModel) -> InputFactory:
    """An InputFactory from an input spec (JSON text), a spec/tensor file path, or None
    (the model's own example inputs). Raises InputSpecError with what to fix."""
    if text_or_path is None or not text_or_path.strip():
        return _own_inputs(loaded)
    text = text_or_path.strip()
    if text[0] in '{["':
        return _from_json(text, loaded)
    if text.lower().endswith(TENSOR_SUFFIXES):
        factory = load_tensor_file(text, loaded.model)
        check_signature(loaded.model, len(factory.args), factory.kwargs)
        return factory
    if text.lower().endswith(".json") and os.path.isfile(text):
        with open(text, encoding="utf-8") as f:
            return _from_json(f.read(), loaded)
    if text.lower().endswith(".json"):
        raise InputSpecError(f"input spec file not found: {text}")
    raise InputSpecError(
        f"--input {text[:80]!r} is neither a JSON input spec nor a tensor file "
        "(.pt, .pth, .safetensors) or a .json spec file.",
        hint=f"For example: --input '{suggest_spec(loaded.model)}'",
    )


def _own_inputs(loaded: LoadedModel) -> InputFactory:
    if loaded.inputs is not None:
        return loaded.inputs
    raise InputSpecError(
        f"{loaded.source_name} brings no example inputs: say what to feed it with --input.",
        hint=f"For example: --input '{suggest_spec(loaded.model)}' "
        "(or add `def example_inputs():` returning the inputs to your file).",
    )


def _from_json(text: str, loaded: LoadedModel) -> InputFactory:
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        line = text.splitlines()[exc.lineno - 1] if text.splitlines() else ""
        raise InputSpecError(
            f"the input spec is not valid JSON: {exc.msg} at line {exc.lineno}, "
            f"column {exc.colno}\n    {line}\n    {' ' * (exc.colno - 1)}^",
            hint='A spec looks like {"x": {"shape": ["B", 3, 224, 224]}, "dims": {"B": 8}}.',
        ) from None
    if isinstance(spec, list):
        args = tuple(_parse_node(v, f"[{i}]") for i, v in enumerate(spec))
        return _finish(args, {}, {}, spec, loaded)
    if not isinstance(spec, dict):
        raise InputSpecError(
            f"the input spec must be a JSON object or list, not {_json_type(spec)}."
        )
    dims = _parse_dims(spec.get("dims", {}))
    if set(spec) == {"dims"}:
        return _override_dims(loaded, dims, spec)
    kwargs = {k: _parse_node(v, k) for k, v in spec.items() if k != "dims"}
    return _finish((), kwargs, dims, spec, loaded)


def _finish(args: tuple, kwargs: dict, dims: dict, spec: object, loaded: LoadedModel):
    factory = SpecFactory(args, kwargs, dims, spec)
    _check_dims_given(factory)
    check_signature(loaded.model, len(args), kwargs)
    return factory


def _override_dims(loaded: LoadedModel, dims: dict[str, int], spec: dict) -> InputFactory:
    base = loaded.inputs
    if base is None or not base.dims:
        raise InputSpecError(
            f'the spec only gives "dims", but {loaded.source_name} has no example inputs '
            "with named dims to apply them to.",
            hint=f"Give the tensors too, e.g. --input '{suggest_spec(loaded.model)}'",
        )
    unknown = sorted(set(dims) - set(base.dims))
    if unknown:
        raise InputSpecError(
            f"dim {unknown[0]!r} is not a dim of {loaded.source_name}'s inputs "
            f"(its dims: {', '.join(base.dims)}).",
        )
    return DimsOverride(base, dims, spec)


def _check_dims_given(factory: SpecFactory) -> None:
    for spec in factory.tensor_specs():
        for d in spec.shape:
            if isinstance(d, str) and d not in factory.dims:
                example = {**factory.dims, d: 8}
                raise InputSpecError(
                    f"dim {d!r} in the shape of {spec.where} has no value.",
                    hint=f'Add it to "dims", e.g. "dims": {json.dumps(example)}.',
                )


def _parse_dims(raw: Any) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise InputSpecError(f'"dims" must be an object like {{"B": 8}}, not {_json_type(raw)}.')
    for name, value in raw.items():
        if not _DIM_NAME.fullmatch(name):
            raise InputSpecError(f'dim name {name!r} in "dims" is not a name (use e.g. B, S).')
        if not _is_int(value) or value <= 0:
            raise InputSpecError(
                f'dim {name!r} in "dims" is {json.dumps(value)}: a size must be a positive integer.'
            )
    return dict(raw)


def _parse_node(node: Any, where: str) -> Any:
    """A TensorSpec, a tuple or dict of nodes, or a scalar passed as is."""
    if isinstance(node, dict) and "shape" in node:
        return _parse_tensor(node, where)
    if isinstance(node, dict):
        return {k: _parse_node(v, f"{where}.{k}") for k, v in node.items()}
    if isinstance(node, list):
        return tuple(_parse_node(v, f"{where}[{i}]") for i, v in enumerate(node))
    return node


def _parse_tensor(node: dict, where: str) -> TensorSpec:
    extra = sorted(set(node) - _TENSOR_KEYS)
    if extra:
        raise InputSpecError(
            f"{where}: unknown key {extra[0]!r} in a tensor spec "
            f"(a tensor has {', '.join(sorted(_TENSOR_KEYS))})."
        )
    shape = node["shape"]
    if not isinstance(shape, list):
        raise InputSpecError(f'{where}: "shape" must be a list, not {_json_type(shape)}.')
    for d in shape:
        _check_dim_entry(d, where)
    dtype = parse_dtype(node.get("dtype", "float32"), where)
    low, high = _parse_bounds(node, dtype, where)
    return TensorSpec(tuple(shape), dtype, low, high, where)


def _check_dim_entry(d: Any, where: str) -> None:
    if isinstance(d, str):
        if not _DIM_NAME.fullmatch(d):
            raise InputSpecError(f"{where}: shape entry {d!r} is not a dim name (use e.g. B, S).")
    elif not _is_int(d):
        raise InputSpecError(
            f"{where}: shape entry {json.dumps(d)} must be a positive integer or a dim name."
        )
    elif d <= 0:
        raise InputSpecError(f"{where}: shape entry {d} must be a positive size.")


def parse_dtype(name: Any, where: str = "dtype") -> torch.dtype:
    """torch dtype from a spec name: "float32", "fp16", "bf16", "int64", "torch.long", ..."""
    key = name.removeprefix("torch.").lower() if isinstance(name, str) else name
    if key not in DTYPES:
        raise InputSpecError(
            f"{where}: unknown dtype {json.dumps(name)}.",
            hint=f"Use one of: {', '.join(DTYPES)}.",
        )
    return DTYPES[key]


def _parse_bounds(node: dict, dtype: torch.dtype, where: str) -> tuple[Any, Any]:
    low, high = node.get("low"), node.get("high")
    for key, value in (("low", low), ("high", high)):
        ok = _is_int(value) if not dtype.is_floating_point else _is_number(value)
        if value is not None and not ok:
            kind = "a number" if dtype.is_floating_point else "an integer"
            raise InputSpecError(f'{where}: "{key}" must be {kind}, not {json.dumps(value)}.')
    effective_high = high
    if high is None and not dtype.is_floating_point:
        effective_high = _default_high(dtype, int(low or 0))
    lo = low if low is not None else 0
    if effective_high is not None and effective_high <= lo:
        raise InputSpecError(
            f'{where}: "low" ({lo}) must be below "high" ({effective_high}); '
            "values are drawn from [low, high)."
        )
    if not dtype.is_floating_point and dtype != torch.bool:
        _check_int_range(dtype, lo, effective_high, where)
    return low, high


def _check_int_range(dtype: torch.dtype, low: int, high: int, where: str) -> None:
    info = torch.iinfo(dtype)
    if low < info.min or high - 1 > info.max:
        raise InputSpecError(
            f"{where}: values in [{low}, {high}) do not fit {dtype} "
            f"(range [{info.min}, {info.max}])."
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")
