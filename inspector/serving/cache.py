"""Finding a model's cache and counting what it holds.

A cache is whatever the model returns for reuse at the next step: a Hugging Face `Cache`
object (`DynamicCache` with one layer object per decoder layer), a legacy tuple of
(key, value) pairs, or a model file's own structure. Its bytes are what its tensors hold
(numel x item size, each view once), not their storages: right after a prefill a
sliding-window layer keeps a window-long view of the whole prompt's keys, and the
excess goes with the first decode step; a server holds the window. Scalar bookkeeping
tensors (a layer's window size) are not counted.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from inspector.memory.tracker import storage_key

__all__ = ["CACHE_PARAMS", "cache_param", "cache_of", "LayerBytes", "layer_bytes", "tensors_in"]

# The names of a forward's cache argument and of its output field, newest first
# (transformers 5 says `cache`; 4.x said `past_key_values`; Mamba said `cache_params`).
CACHE_PARAMS = ("cache", "past_key_values", "cache_params")
_MAX_DEPTH = 6


def cache_param(model: nn.Module) -> str | None:
    """The name under which `model.forward` takes a cache, or None."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in CACHE_PARAMS if name in params), None)


def cache_of(output: Any) -> Any:
    """The cache in a forward's output, or None."""
    for name in CACHE_PARAMS:
        value = output.get(name) if isinstance(output, dict) else getattr(output, name, None)
        if value is not None:
            return value
    return None


def tensors_in(obj: Any, depth: int = 0, seen: set[int] | None = None) -> Iterator[torch.Tensor]:
    """Every tensor reachable from `obj` through containers and plain attributes."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > _MAX_DEPTH or isinstance(obj, nn.Module):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from tensors_in(value, depth + 1, seen)
    elif isinstance(obj, list | tuple):
        for value in obj:
            yield from tensors_in(value, depth + 1, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for value in vars(obj).values():
            yield from tensors_in(value, depth + 1, seen)


def _bytes(tensors: Iterator[torch.Tensor], counted: set[tuple]) -> int:
    total = 0
    for t in tensors:
        key = (storage_key(t), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if t.dim() > 0 and key not in counted:
            counted.add(key)
            total += t.numel() * t.element_size()
    return total


@dataclass(frozen=True)
class LayerBytes:
    kind: str  # the layer object's class, e.g. DynamicLayer, DynamicSlidingWindowLayer
    nbytes: int


def layer_bytes(cache: Any) -> list[LayerBytes]:
    """Bytes per cache layer (one entry for a cache without layers)."""
    counted: set[tuple] = set()
    layers = getattr(cache, "layers", None)
    if isinstance(layers, list | tuple) and layers:
        return [LayerBytes(type(la).__name__, _bytes(tensors_in(la), counted)) for la in layers]
    if isinstance(cache, tuple | list) and cache and all(isinstance(x, tuple) for x in cache):
        return [LayerBytes("key/value", _bytes(tensors_in(la), counted)) for la in cache]
    return [LayerBytes(type(cache).__name__, _bytes(tensors_in(cache), counted))]
