"""torch.fx.symbolic_trace with the standard torch.nn layers as leaves.

A submodule fx cannot trace through (data-dependent control flow inside it) is retried as
a leaf, so the rest of the graph is kept; only a failure in the root's own code fails.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import fx, nn

from inspector.graph.exportcapture import flat_tensors
from inspector.graph.fxerrors import explain_plain
from inspector.graph.modelstate import attributes_kept, buffers_kept

__all__ = [
    "FLAT_INPUTS", "FxCapture", "FxTracer", "constants_left_off",
    "fx_placeholder_values", "trace_fx", "trace_undone", "trace_with_leaves",
]  # fmt: skip

_MAX_RETRIES = 16
FLAT_INPUTS = "inspector_flat_inputs"  # gm.meta key: placeholders are the flat input tensors


@dataclass
class FxCapture:
    graph_module: fx.GraphModule
    leaves: list[str] = field(default_factory=list)  # submodules kept whole after a failure
    first_error: BaseException | None = None  # why the first leaf was needed


class FxTracer(fx.Tracer):
    def __init__(self, leaves: set[str], stack_traces: bool = True) -> None:
        super().__init__()
        self.record_stack_traces = stack_traces  # node.stack_trace: the user's line per node
        self.extra_leaves = leaves
        self.failed_at: str | None = None

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return qualname in self.extra_leaves or super().is_leaf_module(m, qualname)

    def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        if not self._installed(m):
            # A module the model calls but does not hold, such as a function the `kernels`
            # package wraps as a module (transformers' `apply_rotary_pos_emb`): it has no
            # path to name a node by, so its code is traced as a function call's would be.
            return forward(*args, **kwargs)
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_at is None:  # the innermost module raises first
                self.failed_at = self.path_of_module(m)
            raise

    def _installed(self, m: nn.Module) -> bool:
        try:
            self.path_of_module(m)
        except NameError:
            return False
        return True


def _concrete_args(model: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Forward parameters the inputs leave out keep their defaults as constants, so code
    such as `if past_key_values is None:` sees None, not a Proxy."""
    sig = inspect.signature(model.forward)
    bound = sig.bind_partial(*args, **kwargs).arguments
    out = {}
    for name, p in sig.parameters.items():
        if name in bound or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is not p.empty:
            out[name] = p.default
    return out


def trace_fx(model: nn.Module, args: tuple, kwargs: dict) -> FxCapture:
    """Trace `model`; raises the first error when the root itself cannot be traced."""
    concrete = _concrete_args(model, args, kwargs)
    with constants_left_off(model):
        try:
            with trace_undone(model):
                graph, tracer, leaves, first = trace_with_leaves(FxTracer, model, concrete or None)
        except Exception as exc:
            clearer = explain_plain(exc, model)
            if clearer is exc:
                raise
            raise clearer from exc
        gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    return FxCapture(gm, sorted(leaves), first)


@contextmanager
def constants_left_off(model: nn.Module) -> Iterator[None]:
    """fx's tracer stores each tensor constant it meets as `_tensor_constantN` on the
    traced root, the user's own model; the GraphModule keeps its copy, so on the way out
    the model gets back the attributes it had (the `tensor-attribute` rule, and anything
    else that reads the model, must not see ours)."""
    before = set(vars(model))
    try:
        yield
    finally:
        for name in set(vars(model)) - before:
            if name.startswith(_CONSTANT):
                delattr(model, name)


_CONSTANT = "_tensor_constant"


@contextmanager
def trace_undone(model: nn.Module) -> Iterator[None]:
    """Around a trace, before its GraphModule copies what its get_attr nodes name: the
    model's attributes (a forward's `self.hidden = h.detach()` left a Proxy there) and
    buffer values put back; fx's constants stay for the GraphModule (`constants_left_off`
    drops them after)."""
    with attributes_kept(model, new_kept=_CONSTANT), buffers_kept(model):
        yield


def trace_with_leaves(
    make_tracer: Callable[[set[str]], FxTracer],
    root: nn.Module,
    concrete: dict[str, Any] | None,
    roots: frozenset[str] = frozenset(),
    retry: Callable[[BaseException], bool] = lambda exc: True,
) -> tuple[fx.Graph, FxTracer, set[str], BaseException | None]:
    """(graph, tracer, leaves, first error): trace `root`, keeping whole each submodule
    that fails (not those in `roots`, nor for errors `retry` refuses); raises the first
    error when the root itself fails."""
    leaves: set[str] = set()
    first: BaseException | None = None
    for _ in range(_MAX_RETRIES):
        tracer = make_tracer(leaves)
        try:
            graph = tracer.trace(root, concrete_args=concrete)
        except Exception as exc:
            first = first or exc
            at = tracer.failed_at
            if not at or at in leaves or at in roots or not retry(exc):
                raise first from None
            leaves.add(at)
            continue
        return graph, tracer, leaves, first
    raise first  # type: ignore[misc]


def fx_placeholder_values(gm: fx.GraphModule, model: nn.Module, args: tuple, kwargs: dict):
    """The value of each placeholder of `gm`, in order, for `model(*args, **kwargs)`."""
    if gm.meta.get(FLAT_INPUTS):
        return flat_tensors(args, kwargs)
    sig = inspect.signature(model.forward)
    bound = sig.bind_partial(*args, **kwargs)
    bound.apply_defaults()
    values = []
    for node in gm.graph.find_nodes(op="placeholder"):
        name = str(node.target).lstrip("*")
        values.append(bound.arguments.get(name, node.args[0] if node.args else None))
    return values
