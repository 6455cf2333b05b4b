"""Symbolic dims read straight from a symbolic torch.export graph (no extra runs).

Exported with the input axes that move with a named dim left symbolic, every node's
`meta["val"]` carries sizes such as `s0*s1`. The placeholders tell which symbol is which
named dim; a size that is a monomial of mapped symbols becomes "B*S", anything else
keeps its integer.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import torch
from torch import fx

from inspector.graph.records import NodeRecord
from inspector.graph.symdims import format_monomial
from inspector.graph.tensors import tensor_leaves
from inspector.report import Dim, TensorInfo

__all__ = ["symbol_names", "apply_meta_sym_shapes"]


def symbol_names(gm: fx.GraphModule, axis_dims: list[dict[int, str]]) -> dict[Any, str] | None:
    """{sympy symbol: dim name} from the placeholders (in input order); None when two
    named dims share a symbol (they cannot be told apart)."""
    out: dict[Any, str] = {}
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    for node, axes in zip(placeholders, axis_dims, strict=False):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for axis, name in axes.items():
            size = val.shape[axis] if axis < val.dim() else None
            if not isinstance(size, torch.SymInt):
                continue  # export specialized it: that dim stays a number
            expr = size.node.expr
            if not expr.is_Symbol or out.get(expr, name) != name:
                return None
            out[expr] = name
    if len(set(out.values())) != len(out):
        return None
    return out


def _dim(size: Any, names: dict[Any, str], order: list[str], memo: dict) -> Dim:
    if not isinstance(size, torch.SymInt):
        return int(size)
    key = size.node.expr
    if key not in memo:  # sympy is slow, and the same few sizes come back on every node
        memo[key] = _named(size, names, order)
    return memo[key]


def _named(size: torch.SymInt, names: dict[Any, str], order: list[str]) -> Dim:
    expr = size.node.expr
    coef, factors = expr.as_coeff_mul()
    exps: dict[str, int] = {}
    for f in factors:
        base, e = f.as_base_exp()
        if base not in names or not e.is_Integer:
            return int(size.node.hint) if size.node.hint is not None else str(expr)
        exps[names[base]] = exps.get(names[base], 0) + int(e)
    if not coef.is_Rational:
        return int(size.node.hint)
    frac = Fraction(int(coef.p), int(coef.q))
    exps = {d: exps[d] for d in sorted(exps, key=lambda d: order.index(d) if d in order else 99)}
    if frac.numerator != 1 and frac.denominator != 1:
        return int(size.node.hint)
    return format_monomial(frac, exps)


def _assign(
    infos: list[TensorInfo], metas: list[torch.Tensor], names: dict, order: list[str], memo: dict
) -> None:
    if len(infos) != len(metas):
        return
    for info, meta in zip(infos, metas, strict=True):
        if meta.dim() != len(info.shape):
            continue
        sym = [_dim(s, names, order, memo) for s in meta.shape]
        info.sym_shape = sym if any(isinstance(s, str) for s in sym) else None


def apply_meta_sym_shapes(
    gm: fx.GraphModule, records: list[NodeRecord], names: dict[Any, str], order: list[str]
) -> None:
    """Set `sym_shape` on the records of a run of `gm` (one record per node, in order);
    `order`: the named dims in the user's order, for "B*S" rather than "S*B"."""
    nodes = list(gm.graph.nodes)
    if len(nodes) != len(records):
        return

    def val(a: fx.Node) -> Any:
        if a.op == "get_attr":  # parameters: concrete
            return getattr_path(gm, str(a.target))
        return a.meta.get("val")

    memo: dict = {}
    for node, rec in zip(nodes, records, strict=True):
        ins = tensor_leaves(fx.node.map_arg((node.args, node.kwargs), val))
        _assign(rec.in_tensors, ins, names, order, memo)
        if node.op != "output":
            _assign(rec.out_tensors, tensor_leaves(node.meta.get("val")), names, order, memo)


def getattr_path(root: Any, target: str) -> Any:
    for part in target.split("."):
        root = getattr(root, part)
    return root
