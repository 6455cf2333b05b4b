"""The input-spec JSON grammar (DESIGN.md "Input spec"), without torch.

```
{"x": {"shape": ["B", 3, 224, 224]}, "dims": {"B": 32}}          keyword inputs
[{"shape": [8, 16]}, {"shape": [8, 4], "dtype": "int64", "high": 10}]   positional inputs
{"dims": {"B": 64}}                         new dim values for the model's own inputs
```
A tensor is `{"shape": [...], "dtype": ..., "low": ..., "high": ...}`; another object is a
dict input, a list of inputs a tuple input, a JSON scalar is passed as is. A list of plain
numbers is refused: it is nearly always a shape written without `{"shape": ...}`.

`parse_spec_text` is the one parser: the web process calls it to refuse a bad spec with a
422 before anything is queued, and `inspector.inputspec` calls it before mapping dtype
names to torch dtypes and checking the spec against the model's `forward`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from inspector.errors import InputSpecError

__all__ = [
    "SPEC_DTYPES",
    "FLOAT_DTYPES",
    "INT_RANGES",
    "TensorDecl",
    "ParsedSpec",
    "parse_spec_text",
    "parse_spec",
    "spec_dtype",
    "default_int_high",
    "EXAMPLE",
]

# The names a spec may use for a dtype -> its canonical name (torch's, without "torch.").
SPEC_DTYPES: dict[str, str] = {
    **dict.fromkeys(("float32", "float", "fp32"), "float32"),
    **dict.fromkeys(("float16", "half", "fp16"), "float16"),
    **dict.fromkeys(("bfloat16", "bf16"), "bfloat16"),
    **dict.fromkeys(("float64", "double", "fp64"), "float64"),
    **dict.fromkeys(("int64", "long"), "int64"),
    **dict.fromkeys(("int32", "int"), "int32"),
    **dict.fromkeys(("int16", "short"), "int16"),
    "int8": "int8",
    "uint8": "uint8",
    "bool": "bool",
}
FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
# The value range of each integer dtype (torch.iinfo), so bounds are checked without torch.
INT_RANGES: dict[str, tuple[int, int]] = {
    "int64": (-(2**63), 2**63 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int8": (-128, 127),
    "uint8": (0, 255),
}
TENSOR_KEYS = frozenset({"shape", "dtype", "low", "high"})
_DIM_NAME = re.compile(r"[A-Za-z_]\w*")
_DEFAULT_INT_HIGH = 10
EXAMPLE = '{"x": {"shape": ["B", 3, 224, 224]}, "dims": {"B": 8}}'


@dataclass(frozen=True)
class TensorDecl:
    """One tensor of the spec; `where` names it in messages ("input_ids", "[0]", "batch.x")."""

    shape: tuple[int | str, ...]
    dtype: str  # a canonical name: a value of SPEC_DTYPES
    low: float | None
    high: float | None
    where: str

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES


@dataclass(frozen=True)
class ParsedSpec:
    """A spec's inputs as trees of TensorDecl (tuples, dicts, scalars), and its dims."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)
    raw: Any = None  # the JSON value, for the report
    dims_only: bool = False  # {"dims": ...} alone: new sizes for the model's own inputs

    def tensors(self) -> list[TensorDecl]:
        found: list[TensorDecl] = []
        _collect((self.args, self.kwargs), found)
        return found

    def used_dims(self) -> list[str]:
        names = (d for t in self.tensors() for d in t.shape if isinstance(d, str))
        return list(dict.fromkeys(names))


def _collect(node: Any, found: list[TensorDecl]) -> None:
    if isinstance(node, TensorDecl):
        found.append(node)
    elif isinstance(node, dict):
        for value in node.values():
            _collect(value, found)
    elif isinstance(node, tuple):
        for value in node:
            _collect(value, found)


def parse_spec_text(text: str) -> ParsedSpec:
    """Parse JSON text; raises InputSpecError with what to fix (JSON errors with line and
    column)."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        lines = text.splitlines()
        line = lines[exc.lineno - 1] if lines else ""
        raise InputSpecError(
            f"the input spec is not valid JSON: {exc.msg} at line {exc.lineno}, "
            f"column {exc.colno}\n    {line}\n    {' ' * (exc.colno - 1)}^",
            hint=f"A spec looks like {EXAMPLE}.",
        ) from None
    return parse_spec(spec)


def parse_spec(spec: Any) -> ParsedSpec:
    """Parse a decoded JSON value. Everything that does not need the model is checked here:
    keys, shapes, dim names and values, dtypes, bounds."""
    if isinstance(spec, list):
        args = tuple(_parse_input(v, f"[{i}]") for i, v in enumerate(spec))
        return _checked(ParsedSpec(args=args, raw=spec))
    if not isinstance(spec, dict):
        raise InputSpecError(
            f"the input spec must be a JSON object or list, not {_json_type(spec)}.",
            hint=f"A spec looks like {EXAMPLE}.",
        )
    dims = _parse_dims(spec.get("dims", {}))
    if set(spec) == {"dims"}:
        return ParsedSpec(dims=dims, raw=spec, dims_only=True)
    kwargs = {k: _parse_input(v, k) for k, v in spec.items() if k != "dims"}
    return _checked(ParsedSpec(kwargs=kwargs, dims=dims, raw=spec))


def _checked(parsed: ParsedSpec) -> ParsedSpec:
    """Every named dim in a shape has a value in "dims"."""
    for tensor in parsed.tensors():
        for d in tensor.shape:
            if isinstance(d, str) and d not in parsed.dims:
                example = {**parsed.dims, d: 8}
                raise InputSpecError(
                    f"dim {d!r} in the shape of {tensor.where} has no value.",
                    hint=f'Add it to "dims", e.g. "dims": {json.dumps(example)}.',
                )
    return parsed


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


def _parse_input(node: Any, where: str) -> Any:
    """One input: a tensor, a dict or tuple of inputs, or a scalar passed as is."""
    if isinstance(node, list) and node and all(_is_number(v) for v in node):
        raise InputSpecError(
            f"{where}: {json.dumps(node)} is a list of numbers; "
            f'a tensor is written {{"shape": {json.dumps(node)}}}.',
            hint=f"A spec looks like {EXAMPLE}.",
        )
    if isinstance(node, dict) and "shape" in node:
        return _parse_tensor(node, where)
    if isinstance(node, dict):
        return {k: _parse_input(v, f"{where}.{k}") for k, v in node.items()}
    if isinstance(node, list):
        return tuple(_parse_input(v, f"{where}[{i}]") for i, v in enumerate(node))
    return node


def _parse_tensor(node: dict, where: str) -> TensorDecl:
    extra = sorted(set(node) - TENSOR_KEYS)
    if extra:
        raise InputSpecError(
            f"{where}: unknown key {extra[0]!r} in a tensor spec "
            f"(a tensor has {', '.join(sorted(TENSOR_KEYS))})."
        )
    shape = node["shape"]
    if not isinstance(shape, list):
        raise InputSpecError(f'{where}: "shape" must be a list, not {_json_type(shape)}.')
    for d in shape:
        _check_dim_entry(d, where)
    dtype = spec_dtype(node.get("dtype", "float32"), where)
    low, high = _parse_bounds(node, dtype, where)
    return TensorDecl(tuple(shape), dtype, low, high, where)


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


def spec_dtype(name: Any, where: str = "dtype") -> str:
    """The canonical dtype name of a spec name: "fp16" -> "float16", "torch.long" -> "int64"."""
    key = name.removeprefix("torch.").lower() if isinstance(name, str) else None
    if key not in SPEC_DTYPES:
        raise InputSpecError(
            f"{where}: unknown dtype {json.dumps(name)}.",
            hint=f"Use one of: {', '.join(SPEC_DTYPES)}.",
        )
    return SPEC_DTYPES[key]


def default_int_high(dtype: str, low: int) -> int:
    """Integers are drawn from [low, high): by default 10 values, or {0, 1} for bool."""
    return low + (2 if dtype == "bool" else _DEFAULT_INT_HIGH)


def _parse_bounds(node: dict, dtype: str, where: str) -> tuple[Any, Any]:
    low, high = node.get("low"), node.get("high")
    is_float = dtype in FLOAT_DTYPES
    for key, value in (("low", low), ("high", high)):
        ok = _is_number(value) if is_float else _is_int(value)
        if value is not None and not ok:
            kind = "a number" if is_float else "an integer"
            raise InputSpecError(f'{where}: "{key}" must be {kind}, not {json.dumps(value)}.')
    effective_high = high
    if high is None and not is_float:
        effective_high = default_int_high(dtype, int(low or 0))
    lo = low if low is not None else 0
    if effective_high is not None and effective_high <= lo:
        raise InputSpecError(
            f'{where}: "low" ({lo}) must be below "high" ({effective_high}); '
            "values are drawn from [low, high)."
        )
    if dtype in INT_RANGES:
        _check_int_range(dtype, lo, effective_high, where)
    return low, high


def _check_int_range(dtype: str, low: int, high: int, where: str) -> None:
    smallest, largest = INT_RANGES[dtype]
    if low < smallest or high - 1 > largest:
        raise InputSpecError(
            f"{where}: values in [{low}, {high}) do not fit {dtype} "
            f"(range [{smallest}, {largest}])."
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")
