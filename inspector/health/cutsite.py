"""Where a parameter's gradient path is cut: the recorded cut op, and the fx node."""

from __future__ import annotations

import torch

from inspector.health.recorder import CutPoint

__all__ = ["cut_for", "fx_cut_node"]

# fx node targets that leave autograd: detach, `.data`, numpy, integer casts, Python values.
_CUT_TARGETS = {
    "detach",
    "detach_",
    "data",
    "numpy",
    "item",
    "tolist",
    "long",
    "int",
    "short",
    "bool",
    "byte",
    "char",
    "_set_grad_enabled",
}
_INT_DTYPES = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool}


def cut_for(param: str, cuts: list[CutPoint]) -> CutPoint | None:
    """The first recorded cut that the parameter feeds."""
    return next((c for c in cuts if param in c.params), None)


def _is_cut_node(node: torch.fx.Node) -> bool:
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    if node.op == "call_function" and name == "getattr":
        return len(node.args) > 1 and node.args[1] == "data"
    if name in ("to", "type") or name.endswith("_copy"):
        return any(a in _INT_DTYPES for a in (*node.args[1:], *node.kwargs.values()))
    return node.op in ("call_method", "call_function") and name in _CUT_TARGETS


def fx_cut_node(gm: torch.fx.GraphModule | None, module_path: str) -> str | None:
    """Name of the first cut-like node downstream of the module's call (or of its
    parameters' get_attr), in graph order; None without a graph or a match."""
    if gm is None:
        return None
    prefix = module_path + "."
    starts = [
        n
        for n in gm.graph.nodes
        if n.op in ("call_module", "get_attr")
        and isinstance(n.target, str)
        and (n.target == module_path or n.target.startswith(prefix))
    ]
    reached: set[torch.fx.Node] = set()
    stack = list(starts)
    while stack:
        node = stack.pop()
        for user in node.users:
            if user not in reached:
                reached.add(user)
                stack.append(user)
    return next((n.name for n in gm.graph.nodes if n in reached and _is_cut_node(n)), None)
