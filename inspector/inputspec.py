"""The input spec: JSON that says which tensors to feed the model, with named dims.

The grammar is `inspector.schema.inputspec` (torch-free, shared with the web process);
this module turns a parsed spec into tensors and checks it against the model's `forward`.

Integers are drawn from [low, high) (default [0, 10), bool [0, 2)); floats are randn, or
uniform in [low, high) when a bound is given. Or give a tensor file: `.pt`/`.pth`
(weights_only) or `.safetensors`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from inspector.context import InputFactory, Inputs, LoadedModel
from inspector.errors import InputSpecError
from inspector.loaders.signature import check_signature, suggest_spec
from inspector.loaders.tensorfile import TENSOR_SUFFIXES, load_tensor_file
from inspector.schema.inputspec import (
    SPEC_DTYPES,
    TensorDecl,
    default_int_high,
    parse_spec_text,
    spec_dtype,
)

__all__ = ["DTYPES", "TensorSpec", "SpecFactory", "parse_input", "parse_dtype"]

# Canonical spec dtype names (inspector.schema.inputspec) -> torch dtypes.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
# Every name a spec may use -> its torch dtype.
DTYPES: dict[str, torch.dtype] = {name: TORCH_DTYPES[c] for name, c in SPEC_DTYPES.items()}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the spec; `where` names it in messages ("input_ids", "[0]", "batch.x")."""

    shape: tuple[int | str, ...]
    dtype: torch.dtype
    low: float | None
    high: float | None
    where: str

    @classmethod
    def of(cls, decl: TensorDecl) -> TensorSpec:
        return cls(decl.shape, TORCH_DTYPES[decl.dtype], decl.low, decl.high, decl.where)

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
    return default_int_high("bool" if dtype == torch.bool else "int", low)


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
    if text[0] in '{["' or _decodes(text):  # JSON text, whatever the API would be sent
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


def _decodes(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _own_inputs(loaded: LoadedModel) -> InputFactory:
    if loaded.inputs is not None:
        return loaded.inputs
    raise InputSpecError(
        f"{loaded.source_name} brings no example inputs: say what to feed it with --input.",
        hint=f"For example: --input '{suggest_spec(loaded.model)}' "
        "(or add `def example_inputs():` returning the inputs to your file).",
    )


def _from_json(text: str, loaded: LoadedModel) -> InputFactory:
    parsed = parse_spec_text(text)  # the grammar the web process checks too
    if parsed.dims_only:
        return _override_dims(loaded, parsed.dims, parsed.raw)
    args, kwargs = tree_map(_torch_leaf, (parsed.args, parsed.kwargs))
    factory = SpecFactory(tuple(args), dict(kwargs), parsed.dims, parsed.raw)
    check_signature(loaded.model, len(args), kwargs)
    return factory


def _torch_leaf(node: Any) -> Any:
    return TensorSpec.of(node) if isinstance(node, TensorDecl) else node


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


def parse_dtype(name: Any, where: str = "dtype") -> torch.dtype:
    """torch dtype from a spec name: "float32", "fp16", "bf16", "int64", "torch.long", ..."""
    return TORCH_DTYPES[spec_dtype(name, where)]
