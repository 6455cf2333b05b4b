"""Run the forward once and hand every node's output to an observer.

Two granularities: the captured fx/export graph (one value per op, run with a
`torch.fx.Interpreter`), or module calls (forward hooks on the real model, one value per
call). The graph names values like `ctx.report.nodes`; module calls are matched to the
report's `call_module`/`module` nodes by path and call index, else named by their module
path ("" for the root; "path@k" for the k-th repeated call).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from inspector.context import Context
from inspector.graph.fxcapture import FLAT_INPUTS, fx_placeholder_values

__all__ = [
    "NodeRef",
    "run_nodes",
    "replays_graph",
    "graph_feed",
    "kind_of",
    "module_values",
    "module_calls",
    "module_node_names",
    "call_name",
    "OnValue",
]

_KINDS = {
    "relu": "relu",
    "relu_": "relu",
    "relu6": "relu",
    "sigmoid": "sigmoid",
    "sigmoid_": "sigmoid",
    "tanh": "tanh",
    "tanh_": "tanh",
}
_MODULE_KINDS = {nn.ReLU: "relu", nn.ReLU6: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh"}


@dataclass(frozen=True)
class NodeRef:
    name: str
    kind: str  # "relu", "sigmoid", "tanh" or ""
    module_path: str | None


OnValue = Callable[[NodeRef, Any], None]


def kind_of(target: Any) -> str:
    """'relu' for torch.relu, F.relu, 'relu_', aten.relu.default, nn.ReLU, ..."""
    if isinstance(target, nn.Module):
        return next((k for cls, k in _MODULE_KINDS.items() if isinstance(target, cls)), "")
    name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
    return next((_KINDS[p] for p in str(name).split(".") if p in _KINDS), "")


def run_nodes(
    ctx: Context, on_value: OnValue, *, graph: bool = True, on_reset: Callable[[], None] = None
) -> tuple[Any, str]:
    """Run the forward once; returns (output, "graph" | "modules"). When the graph does
    not run on real values, `on_reset()` is called and the module calls are used."""
    gm = ctx.capture.graph_module if ctx.capture is not None else None
    feed = graph_feed(gm, ctx) if graph and gm is not None else None
    if feed is not None:
        try:
            return _Observed(gm, ctx, on_value).run(*feed), "graph"
        except Exception:  # noqa: BLE001 - a graph that only traces; the model still runs
            if on_reset is not None:
                on_reset()
    return _run_modules(ctx, on_value), "modules"


def replays_graph(ctx: Context) -> bool:
    """Whether `run_nodes` tries the captured graph (else it runs the module calls)."""
    gm = ctx.capture.graph_module if ctx.capture is not None else None
    return gm is not None and graph_feed(gm, ctx) is not None


def graph_feed(gm: torch.fx.GraphModule, ctx: Context) -> list[Any] | None:
    """Values for the graph's placeholders: by forward-parameter name (fx), else the
    flattened inputs in order (export); None when neither fits."""
    if gm.meta.get(FLAT_INPUTS):
        return fx_placeholder_values(gm, ctx.model, ctx.inputs.args, ctx.inputs.kwargs)
    holders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    try:
        bound = inspect.signature(ctx.model.forward).bind(*ctx.inputs.args, **ctx.inputs.kwargs)
        named = dict(bound.arguments)
        feed = [
            named[h.target.lstrip("*")] if h.target.lstrip("*") in named else h.args[0]
            for h in holders
        ]
        return feed
    except (TypeError, ValueError, KeyError, IndexError):
        pass
    flat, _ = torch.utils._pytree.tree_flatten((ctx.inputs.args, ctx.inputs.kwargs))
    return flat if len(flat) == len(holders) else None


class _Observed(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, ctx: Context, on_value: OnValue) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.on_value = on_value
        self.paths = {n.name: n.module_path for n in ctx.report.nodes}

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        if n.op not in ("output", "get_attr"):
            target = self.module.get_submodule(n.target) if n.op == "call_module" else n.target
            path = self.paths.get(n.name, n.target if n.op == "call_module" else None)
            self.on_value(NodeRef(n.name, kind_of(target), path), result)
        return result


def module_node_names(ctx: Context) -> dict[str, list[str]]:
    """The report's node names of each module's calls, in call order, by module path."""
    names: dict[str, list[str]] = {}
    for node in ctx.report.nodes:
        if node.op in ("call_module", "module") and node.module_path is not None:
            names.setdefault(node.module_path, []).append(node.name)
    return names


def _run_modules(ctx: Context, on_value: OnValue) -> Any:
    with module_values(ctx, on_value):
        return ctx.inputs.call(ctx.model)


def call_name(known: dict[str, list[str]], path: str, k: int) -> str:
    """The name of the k-th call (from 0) of the module at `path`: the report's node of
    that call (`known`: module_node_names), else its path, "@k" added after the first."""
    names = known.get(path, [])
    return names[k] if k < len(names) else path + (f"@{k}" if k else "")


@contextmanager
def module_values(ctx: Context, on_value: OnValue) -> Iterator[None]:
    """`on_value` on each module call's output, named as the graph's node of that call,
    while the block runs the model (here, or in another pass's forward)."""
    known = module_node_names(ctx)

    def on_call(path: str, k: int, module: nn.Module, output: Any) -> None:
        on_value(NodeRef(call_name(known, path, k), kind_of(module), path), output)

    with module_calls(ctx.model, on_call):
        yield


@contextmanager
def module_calls(
    model: nn.Module, on_call: Callable[[str, int, nn.Module, Any], None]
) -> Iterator[None]:
    """`on_call(path, k, module, output)` on each module call's output while the block
    runs: its path and call number (from 0), before any graph names it."""
    calls: dict[str, int] = {}

    def hook_for(path: str):  # noqa: ANN202
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            k = calls[path] = calls.get(path, -1) + 1
            on_call(path, k, module, output)

        return hook

    handles = [m.register_forward_hook(hook_for(p)) for p, m in model.named_modules()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
