"""Check inputs against the model's `forward` signature, and suggest a spec for it."""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable

from torch import nn

from inspector.errors import InputSpecError
from inspector.loaders.factories import forward_params

__all__ = ["check_signature", "suggest_spec"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
_POS_ONLY = inspect.Parameter.POSITIONAL_ONLY
_SPATIAL = {1: [128], 2: [224, 224], 3: [16, 112, 112]}  # a typical input per conv rank


def _forward_name(model: nn.Module) -> str:
    return f"{type(model).__name__}.forward"


def _describe(params: dict[str, inspect.Parameter]) -> str:
    marks = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return ", ".join(marks.get(p.kind, "") + n for n, p in params.items())


def check_signature(model: nn.Module, n_args: int, keywords: Iterable[str]) -> None:
    """Raise InputSpecError when `n_args` positional inputs plus `keywords` cannot be
    passed to `model.forward`: an unknown keyword, too many positional inputs, or a
    required parameter left out. Silent when the signature cannot be read."""
    params = forward_params(model)
    if params is None:
        return
    keywords = list(keywords)
    kinds = {p.kind for p in params.values()}
    named = f"{_forward_name(model)}({_describe(params)})"
    accepted = [n for n, p in params.items() if p.kind not in (*_VARIADIC, _POS_ONLY)]
    unknown = [k for k in keywords if k not in accepted]
    if unknown and inspect.Parameter.VAR_KEYWORD not in kinds:
        raise InputSpecError(
            f"input {unknown[0]!r} is not a parameter of {named}.",
            hint=f"Use the names of forward's parameters: {', '.join(accepted) or '(none)'}.",
        )
    positional = [n for n, p in params.items() if p.kind in _POSITIONAL]
    if n_args > len(positional) and inspect.Parameter.VAR_POSITIONAL not in kinds:
        raise InputSpecError(
            f"the input spec gives {n_args} positional inputs but {named} takes {len(positional)}.",
            hint="Remove the extra inputs, or name each input after forward's parameters.",
        )
    given = set(positional[:n_args]) | set(keywords)
    missing = [n for n, p in params.items() if _required(p) and n not in given]
    if missing:
        first = missing[0] == next(iter(params))
        example = _first_layer_tensor(model) if first else {"shape": ["B", 16]}
        raise InputSpecError(
            f"missing input {missing[0]!r}: a required parameter of {named}.",
            hint=f'Add it to the spec, e.g. "{missing[0]}": {json.dumps(example)} '
            '(with "dims": {"B": 8}).',
        )


def _required(p: inspect.Parameter) -> bool:
    return p.kind not in _VARIADIC and p.default is inspect.Parameter.empty


def suggest_spec(model: nn.Module) -> str:
    """An input spec for `model` to start from: its required forward parameters, the
    first one shaped after the model's first layer (Conv, Linear, Embedding)."""
    params = forward_params(model) or {}
    names = [n for n, p in params.items() if _required(p)] or list(params)[:1] or ["x"]
    names = [n for n in names if params.get(n) is None or params[n].kind not in _VARIADIC]
    spec: dict[str, object] = {n: {"shape": ["B", 16]} for n in names or ["x"]}
    spec[next(iter(spec))] = _first_layer_tensor(model)
    spec["dims"] = {"B": 8, "S": 128} if "S" in json.dumps(spec) else {"B": 8}
    return json.dumps(spec)


def _first_layer_tensor(model: nn.Module) -> dict[str, object]:
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return {"shape": ["B", "S"], "dtype": "int64", "high": module.num_embeddings}
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            spatial = _SPATIAL[len(module.kernel_size)]
            return {"shape": ["B", module.in_channels, *spatial]}
        if isinstance(module, nn.Linear):
            return {"shape": ["B", module.in_features]}
    return {"shape": ["B", 16]}
