"""Input checks before queueing: the spec's JSON shape (DESIGN.md "Input spec") and tensor
files. Pure JSON: the web process never imports torch; the job child does the full parse."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from server.api.errors import ApiError

__all__ = ["check_input_spec", "input_file_kind", "check_input_file", "DTYPES"]

_FLOATS = ("float32", "float", "fp32", "float16", "half", "fp16", "bfloat16", "bf16", "float64")
_OTHERS = ("double", "fp64", "int64", "long", "int32", "int", "int16", "short", "int8", "uint8")
DTYPES = frozenset(_FLOATS + _OTHERS + ("bool", "complex64", "complex128"))
INPUT_FILE_KINDS = {".pt": "pt", ".pth": "pt", ".safetensors": "safetensors"}
EXAMPLE = '{"x": {"shape": ["B", 3, 224, 224]}, "dims": {"B": 8}}'
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


def _invalid(message: str) -> ApiError:
    return ApiError(422, "invalid", f"input spec: {message}", {"example": EXAMPLE})


def check_input_spec(text: str) -> None:
    """Refuse text that is not an input spec: bad JSON (with line and column), a wrong shape."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid(
            f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    if isinstance(spec, list):
        for i, item in enumerate(spec):
            _check_value(item, f"[{i}]")
    elif isinstance(spec, dict):
        _check_dims(spec.get("dims", {}))
        for key, value in spec.items():
            if key != "dims":
                _check_value(value, key)
    else:
        raise _invalid("expected a JSON object (inputs by name) or a list (positional inputs)")


def _check_dims(dims: Any) -> None:
    if not isinstance(dims, dict):
        raise _invalid('"dims" must be an object such as {"B": 8, "S": 128}')
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _invalid(f'dims["{name}"] must be a positive integer, got {value!r}')


def _check_value(value: Any, where: str) -> None:
    if isinstance(value, dict) and "shape" in value:
        _check_tensor(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_value(item, f"{where}.{key}")
    elif isinstance(value, list) and value and not all(isinstance(v, dict | list) for v in value):
        raise _invalid(f'{where}: a tensor is written {{"shape": {json.dumps(value)}}}')
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_value(item, f"{where}[{i}]")
    else:
        raise _invalid(f'{where}: expected a tensor {{"shape": [...]}}, got {json.dumps(value)}')


def _check_tensor(spec: dict[str, Any], where: str) -> None:
    shape = spec["shape"]
    if not isinstance(shape, list):
        raise _invalid(f"{where}.shape must be a list of sizes or dim names")
    for dim in shape:
        if isinstance(dim, str) and dim.strip():
            continue
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise _invalid(f"{where}.shape: {dim!r} is not a positive size or a dim name")
    dtype = spec.get("dtype", "float32")
    if not isinstance(dtype, str) or dtype.removeprefix("torch.") not in DTYPES:
        raise _invalid(
            f"{where}.dtype {dtype!r} is unknown (use one of {', '.join(sorted(DTYPES))})"
        )
    for bound in ("low", "high"):
        if bound in spec and (
            isinstance(spec[bound], bool) or not isinstance(spec[bound], int | float)
        ):
            raise _invalid(f"{where}.{bound} must be a number")
    if "low" in spec and "high" in spec and spec["low"] >= spec["high"]:
        raise _invalid(f"{where}: low ({spec['low']}) must be below high ({spec['high']})")


def input_file_kind(filename: str) -> str:
    kind = INPUT_FILE_KINDS.get(Path(filename).suffix.lower())
    if kind is None:
        raise ApiError(
            422,
            "invalid",
            f"input file {filename!r}: use a .pt/.pth (tensors) or .safetensors file",
        )
    return kind


def check_input_file(path: Path, kind: str, filename: str) -> None:
    """A cheap sanity check; loading (weights_only / safetensors) happens in the sandbox."""
    size = path.stat().st_size
    if size == 0:
        raise ApiError(422, "invalid", f"input file {filename!r} is empty")
    if kind == "safetensors":
        _check_safetensors_header(path, size, filename)


def _check_safetensors_header(path: Path, size: int, filename: str) -> None:
    # Layout: 8-byte little-endian header length, then that many bytes of JSON.
    with open(path, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        ok = 0 < length <= min(size - 8, MAX_SAFETENSORS_HEADER)
        try:
            ok = ok and isinstance(json.loads(f.read(length)), dict)
        except ValueError:
            ok = False
    if not ok:
        raise ApiError(422, "invalid", f"input file {filename!r} is not a safetensors file")
