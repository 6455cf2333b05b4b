"""torch.fx.symbolic_trace with the standard torch.nn layers as leaves.

A submodule fx cannot trace through (data-dependent control flow inside it) is retried as
a leaf, so the rest of the graph is kept; only a failure in the root's own code fails.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from torch import fx, nn

__all__ = ["FxCapture", "trace_fx", "fx_placeholder_values"]

_MAX_RETRIES = 16


@dataclass
class FxCapture:
    graph_module: fx.GraphModule
    leaves: list[str] = field(default_factory=list)  # submodules kept whole after a failure
    first_error: BaseException | None = None  # why the first leaf was needed


class _Tracer(fx.Tracer):
    def __init__(self, leaves: set[str]) -> None:
        super().__init__()
        self.record_stack_traces = True  # node.stack_trace: the user's line per node
        self.extra_leaves = leaves
        self.failed_at: str | None = None

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return qualname in self.extra_leaves or super().is_leaf_module(m, qualname)

    def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_at is None:  # the innermost module raises first
                self.failed_at = self.path_of_module(m)
            raise


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
    leaves: set[str] = set()
    first: BaseException | None = None
    for _ in range(_MAX_RETRIES):
        tracer = _Tracer(leaves)
        try:
            graph = tracer.trace(model, concrete_args=concrete or None)
        except Exception as exc:
            first = first or exc
            if not tracer.failed_at or tracer.failed_at in leaves:
                raise first from None
            leaves.add(tracer.failed_at)
            continue
        gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
        return FxCapture(gm, sorted(leaves), first)
    raise first  # type: ignore[misc]


def fx_placeholder_values(gm: fx.GraphModule, model: nn.Module, args: tuple, kwargs: dict):
    """The value of each placeholder of `gm`, in order, for `model(*args, **kwargs)`."""
    sig = inspect.signature(model.forward)
    bound = sig.bind_partial(*args, **kwargs)
    bound.apply_defaults()
    values = []
    for node in gm.graph.find_nodes(op="placeholder"):
        name = str(node.target).lstrip("*")
        values.append(bound.arguments.get(name, node.args[0] if node.args else None))
    return values
