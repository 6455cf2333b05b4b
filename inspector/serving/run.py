"""Tracked serving steps on fake tensors: a prefill that builds the cache, a decode step
that reads it. Live bytes are counted by the memory pass's `LiveTracker`, so a peak here
means what it means in the training figures: every storage alive at the worst op.

As serving engines do, a prefill asks for the next token's logits only
(`logits_to_keep=1`) when the model takes that argument: the full [B, S, vocab] logits of
a training forward would dominate the peak of a large-vocabulary model.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from inspector.context import Inputs
from inspector.memory.step import unique_tensors
from inspector.memory.tracker import LiveTracker
from inspector.serving.cache import LayerBytes, cache_of, layer_bytes, tensors_in

__all__ = ["Step", "StepMemory", "prefill", "decode", "serving_kwargs", "token_ids"]

# A model file's generate_step(model, tokens, cache) -> (logits, cache)
Step = Callable[[nn.Module, torch.Tensor, Any], tuple[Any, Any]]


@dataclass
class StepMemory:
    peak_bytes: int
    cache: Any  # the cache after the step
    layers: list[LayerBytes]
    op_count: int = 0  # aten ops the step ran (a model that loops over tokens: grows with S)

    @property
    def cache_bytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)


def _takes(model: nn.Module, name: str) -> bool:
    params = inspect.signature(model.forward).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def serving_kwargs(model: nn.Module) -> dict[str, Any]:
    """use_cache=True, and logits_to_keep=1 when the model takes it."""
    kwargs: dict[str, Any] = {"use_cache": True} if _takes(model, "use_cache") else {}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = 1
    return kwargs


def _tracked(model: nn.Module, resident: list[torch.Tensor], call: Any) -> tuple[LiveTracker, Any]:
    """The peak of `call()` with the model and `resident` counted from the start. The
    tracker holds no reference to `resident`: a cache layer the step replaces (transformers
    concatenates a new one) is freed when the model drops it, as in a real decode loop."""
    tracker = LiveTracker()
    for t in unique_tensors([*model.parameters(), *model.buffers(), *resident]):
        tracker.add(t, "static")
    resident.clear()
    with torch.no_grad(), tracker:
        output = call()
    return tracker, output


def prefill(
    model: nn.Module, inputs: Inputs, fake_mode: Any, step: Step | None = None
) -> StepMemory:
    """`model(inputs)` with its cache on (or the model file's `generate_step` with no cache
    yet): the peak, and the cache it returns."""
    model.eval()
    if step is not None:
        tokens = token_ids(inputs)
        with fake_mode:
            tracker, output = _tracked(model, [tokens], lambda: step(model, tokens, None))
        return _step(tracker, output[1])
    kwargs = {**inputs.kwargs, **serving_kwargs(model)}
    with fake_mode:
        tracker, output = _tracked(model, inputs.tensors(), lambda: model(*inputs.args, **kwargs))
    return _step(tracker, cache_of(output))


def decode(
    model: nn.Module,
    tokens: torch.Tensor,
    cache: Any,
    cache_name: str | None,
    fake_mode: Any,
    step: Step | None = None,
) -> StepMemory:
    """One decode step: the next token of each sequence, reading (and growing) `cache`."""
    model.eval()
    resident = [tokens, *tensors_in(cache)]
    if step is not None:
        with fake_mode:
            tracker, output = _tracked(model, resident, lambda: step(model, tokens, cache))
        return _step(tracker, output[1])
    kwargs = {cache_name: cache, **serving_kwargs(model)}
    with fake_mode:
        tracker, output = _tracked(model, resident, lambda: model(tokens, **kwargs))
    return _step(tracker, cache_of(output))


def token_ids(inputs: Inputs) -> torch.Tensor:
    """The token ids among the inputs: `input_ids`, else the first integer tensor."""
    named = inputs.kwargs.get("input_ids")
    if isinstance(named, torch.Tensor):
        return named
    ints = [t for t in inputs.tensors() if not t.is_floating_point()]
    if not ints:
        raise ValueError("the inputs have no integer tensor of token ids to decode from")
    return ints[0]


def _step(tracker: LiveTracker, cache: Any) -> StepMemory:
    layers = layer_bytes(cache) if cache is not None else []
    return StepMemory(tracker.peak, cache, layers, tracker.op_count)
