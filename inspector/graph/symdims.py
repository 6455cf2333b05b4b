"""Symbolic dims: which output dims follow the user's named dims, and how.

For each named dim, one extra fake run with that dim alone changed (halved when it stays
>= 2, else doubled: halving stays under limits such as a model's max positions). Every
tensor dim is then fitted to a monomial c * prod(dim^e) over the named dims that moved it,
e.g. "B", "B*S", "2*S", "S/2". Matching is by run, never by value: a head count of 8 is
not B=8 because it does not move when B does. A dim with no exact monomial keeps its
integer; a failed perturbed run leaves its dim concrete.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from inspector.graph.records import NodeRecord
from inspector.report import Dim, TensorInfo

__all__ = ["perturbed_value", "apply_sym_shapes", "monomial", "format_monomial"]

_EXPONENTS = (1, -1, 2, -2, 3)


def perturbed_value(v: int) -> int:
    return v // 2 if v % 2 == 0 and v // 2 >= 2 else v * 2


def monomial(base: int, moved: dict[str, tuple[int, int, int]]) -> Dim:
    """`base` at the defaults; moved[d] = (default, perturbed value of d, dim there)."""
    exps: dict[str, int] = {}
    for d, (v, v2, size) in moved.items():
        e = next((e for e in _EXPONENTS if Fraction(v2, v) ** e == Fraction(size, base)), None)
        if e is None:
            return base
        exps[d] = e
    if not exps:
        return base
    coef = Fraction(base)
    for d, e in exps.items():
        coef /= Fraction(moved[d][0]) ** e
    if coef.numerator != 1 and coef.denominator != 1:
        return base
    return format_monomial(coef, exps)


def format_monomial(coef: Fraction, exps: dict[str, int]) -> str:
    def term(d: str, e: int) -> str:
        return d if abs(e) == 1 else f"{d}^{abs(e)}"

    num = [term(d, e) for d, e in exps.items() if e > 0]
    den = [term(d, e) for d, e in exps.items() if e < 0]
    if coef.numerator != 1:
        num.insert(0, str(coef.numerator))
    if coef.denominator != 1:
        den.insert(0, str(coef.denominator))
    text = "*".join(num) or "1"
    if den:
        text += "/" + (den[0] if len(den) == 1 else "(" + "*".join(den) + ")")
    return text


def _tensors(rec: NodeRecord) -> list[TensorInfo]:
    return rec.in_tensors + rec.out_tensors


def apply_sym_shapes(
    records: list[NodeRecord],
    dims: dict[str, int],
    rerun: Callable[[str, int], list[NodeRecord] | None],
    by_name: bool,
) -> list[str]:
    """Set `sym_shape` on every TensorInfo of `records`; returns the dims whose run failed.

    `rerun(dim, value)` records a run with `dim` changed (None when it failed); records are
    matched by position (fx, hooks) or by node name (export graphs, re-exported)."""
    runs: dict[str, tuple[int, int, list[NodeRecord | None]]] = {}
    failed = []
    for d, v in dims.items():
        v2 = perturbed_value(v)
        other = rerun(d, v2)
        if other is None:
            failed.append(d)
            continue
        runs[d] = (v, v2, _match(records, other, by_name))
    for i, rec in enumerate(records):
        for k, info in enumerate(_tensors(rec)):
            info.sym_shape = _sym_shape(info, i, k, runs)
    return failed


def _sym_shape(info: TensorInfo, i: int, k: int, runs: dict) -> list[Dim] | None:
    moved_by_axis: list[dict[str, tuple[int, int, int]]] = [{} for _ in info.shape]
    for d, (v, v2, matched) in runs.items():
        other = matched[i]
        tensors = _tensors(other) if other is not None else []
        if k >= len(tensors) or len(tensors[k].shape) != len(info.shape):
            continue
        for axis, (a, b) in enumerate(zip(info.shape, tensors[k].shape, strict=True)):
            if a != b:
                moved_by_axis[axis][d] = (v, v2, b)
    sym = [monomial(size, moved) for size, moved in zip(info.shape, moved_by_axis, strict=True)]
    return sym if any(isinstance(s, str) for s in sym) else None


def _match(
    base: list[NodeRecord], other: list[NodeRecord], by_name: bool
) -> list[NodeRecord | None]:
    if by_name:
        named = {r.name: r for r in other}
        out = [named.get(r.name) for r in base]
        return [
            o if o is not None and o.target == r.target else None
            for o, r in zip(out, base, strict=True)
        ]
    if len(base) != len(other):
        return [None] * len(base)
    return [o if o.name == r.name else None for r, o in zip(base, other, strict=True)]
