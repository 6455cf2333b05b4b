"""Gradients w.r.t. every node's output (hooks on the outputs' grads), and the first node,
in backward order, whose output gradient holds NaN/Inf."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import torch

from inspector.context import Context
from inspector.health.backprop import AutogradGraph, autograd_graph, grad_norm
from inspector.health.outputs import LossOutput, flat_tensors, float_outputs, make_loss
from inspector.health.state import seeded
from inspector.health.values import NodeRef, OnValue, module_values, run_nodes
from inspector.memory.allocations import ours

__all__ = [
    "ExpectedLoss", "LossDiverged", "NodeGrads", "node_grads", "Observer", "OnEagerForward",
    "recording_grads", "record_grad",
]  # fmt: skip


class Observer(Protocol):
    on_value: OnValue

    def reset(self) -> None: ...


@dataclass
class NodeGrads:
    norms: dict[str, float] = field(default_factory=dict)
    first_nan: str | None = None
    method: str = ""
    backward_ran: bool = False


class LossDiverged(RuntimeError):
    """The replay's loss is not the one expected: it computed something else (a graph
    captured in eval mode, random draws in another order), or its backward would (a
    `torch.no_grad()` block or a custom autograd.Function, which an fx graph does not
    keep), so its grads are not the eager forward's."""


@dataclass(frozen=True)
class ExpectedLoss:
    """What the eager forward's loss was: its value and its autograd graph."""

    value: float
    graph: AutogradGraph
    # the outputs its default loss was formed from (None: the user's loss_fn)
    outputs: tuple[LossOutput, ...] | None = None


def _first_grad_tensor(value: Any) -> torch.Tensor | None:
    return next((t for _, t in flat_tensors(value) if t.requires_grad), None)


def node_grads(
    ctx: Context, also: Observer | None = None, expect: ExpectedLoss | None = None
) -> NodeGrads:
    """`also` sees every node's value too (the numerics statistics, from this forward).
    `expect`: the eager forward's loss, which this one must be, value and autograd graph,
    before its backward runs (else LossDiverged)."""
    result = NodeGrads()
    on_value = recording_grads(result, also)

    def on_reset() -> None:
        result.norms.clear()
        if also is not None:
            also.reset()

    seeded(ctx.options.seed)
    output, result.method = run_nodes(ctx, on_value, on_reset=on_reset)
    loss, _ = make_loss(_as_eager(output, expect), ctx.inputs, ctx.loaded.loss_fn)
    if expect is not None and not _same_loss(loss, expect):
        raise LossDiverged(f"the replay's loss is not the eager forward's {expect.value}")
    if loss is not None and loss.requires_grad:
        loss.backward()
        result.backward_ran = True
    return result


def recording_grads(
    result: NodeGrads,
    also: Observer | None,
    record: Callable[[str, torch.Tensor], None] | None = None,
) -> OnValue:
    """Each node's output gradient into `result` (by a hook on the output, which fires in
    the backward; `record(name, grad)` in its place where given); `also` sees the value."""
    record = record or partial(record_grad, result)

    def on_value(ref: NodeRef, value: Any) -> None:
        tensor = _first_grad_tensor(value)
        if tensor is not None:
            tensor.register_hook(partial(record, ref.name))
        if also is not None:
            also.on_value(ref, value)

    return on_value


class OnEagerForward:
    """`node_grads` by module calls, on the gradients pass's eager forward and backward
    themselves (a ForwardWatch): where no captured graph replays, `node_grads` ran the
    same eager forward again, with the same hooks, and a second backward (Mask R-CNN:
    1.9 s of its 3.8 s pass). Its work is hidden from the recorder of the user's ops, and
    a failure of its own stops it, not the user's forward: `error` says what it was."""

    def __init__(self, also: Observer | None) -> None:
        self.result = NodeGrads(method="modules")
        self.error: Exception | None = None
        self._on_value = recording_grads(self.result, also, self._record)

    @contextmanager
    def watching(self, ctx: Context) -> Iterator[None]:
        with module_values(ctx, self._observe):
            yield

    def _observe(self, ref: NodeRef, value: Any) -> None:
        if self.error is not None:
            return
        try:
            with torch._C.DisableTorchFunction():
                self._on_value(ref, value)
        except Exception as exc:  # noqa: BLE001 - per-node grads are extra; keep the forward
            self.error = exc

    def _record(self, name: str, grad: torch.Tensor) -> None:
        if self.error is not None:
            return
        try:
            record_grad(self.result, name, grad)
        except Exception as exc:  # noqa: BLE001 - as above; the gradient flows on unchanged
            self.error = exc

    def finish(self, output: Any) -> None:
        pass


def _as_eager(output: Any, expect: ExpectedLoss | None) -> Any:
    """The replay's outputs the eager loss was formed from, in its order. A captured graph
    returns as tensors what the eager model keeps in objects the loss does not look into:
    GPT-2's key/value cache (a transformers DynamicCache) came back as 24 more outputs of
    the fx graph, after the logits; the replay's loss was another one, and the report ran
    the eager forward and backward and the replay again (GPT-2 small at [4, 512]:
    the pass took 147 s, now 70 s).
    Eager's outputs are taken by their labels where the replay has them all, else each is
    the replay's next output of its shape and dtype; the loss check after this decides."""
    if expect is None or expect.outputs is None:
        return output
    replayed = [(label, t) for label, t in float_outputs(output) if t.numel()]
    if len(replayed) <= len(expect.outputs):
        return output  # nothing more than eager's: taken as it is
    by_label = dict(replayed)
    if all(label in by_label for label, _, _ in expect.outputs):
        return [by_label[label] for label, _, _ in expect.outputs]
    picked: list[torch.Tensor] = []
    rest = iter(t for _, t in replayed)
    for _, shape, dtype in expect.outputs:
        t = next((t for t in rest if _fits(t, shape, dtype)), None)
        if t is None:
            return output  # not there: the loss check says so
        picked.append(t)
    return picked


def _fits(t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    return tuple(t.shape) == shape and t.dtype == dtype


def _same_loss(loss: torch.Tensor | None, expected: ExpectedLoss) -> bool:
    if loss is None or not loss.requires_grad:
        return False
    # the same ops on the same values: equal but for float rounding in another order
    same = math.isclose(float(loss.detach()), expected.value, rel_tol=1e-6)
    return same and autograd_graph(loss) == expected.graph


def record_grad(result: NodeGrads, name: str, grad: torch.Tensor) -> None:
    with ours():  # left out of a recorded step (inspector/memory/merged.py)
        norm, blown = grad_norm(grad)
    if name in result.norms:  # a node whose output is read twice: the hook sees the sum
        return
    result.norms[name] = norm
    if result.first_nan is None and blown:
        result.first_nan = name
