"""Runs of repeated identical blocks in a report's module tree, so that big models stay
readable: GPT-2's twelve `GPT2Block`s become one "GPT2Block × 12" in the pages.

A run is consecutive siblings (the report's module order) under one parent, each a
module with children, of the same type and the same insides: the same sub-modules (their
relative paths, types, shapes, parameter counts) and the same graph nodes in the same
order (op, target, output shapes with their named dims, and which earlier node of the
block each reads). ResNet's first block of a stage has a `downsample` the others lack,
so it stays out of the run.

Works on the report's JSON (dicts), not on validated models: the page reads reports of
thousands of nodes without validating them. No torch.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Fold", "MEASURES", "find_folds", "fold_id"]

# Module measures a fold shows per block and summed over its blocks.
MEASURES = (
    "params",
    "trainable_params",
    "param_bytes",
    "flops_forward",
    "flops_backward",
    "output_bytes",
    "saved_activation_bytes",
    "calls",
)
Json = Mapping[str, Any]


@dataclass(frozen=True)
class Fold:
    """A run of identical blocks: `paths` (in order) under `parent`, all of `type`."""

    id: str  # "transformer.h.0..11": ".." never occurs in a module path
    parent: str
    type: str
    paths: list[str]
    label: str  # "GPT2Block × 12"
    per_block: dict[str, int | None]  # a block's measure, None where the blocks differ
    total: dict[str, int | None]  # summed over the blocks, None where none has one

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def fold_id(paths: Sequence[str]) -> str:
    """`["h.0", ..., "h.11"]` -> "h.0..11"."""
    return f"{paths[0]}..{paths[-1].rsplit('.', 1)[-1]}"


def find_folds(modules: Sequence[Json], nodes: Sequence[Json], min_count: int = 2) -> list[Fold]:
    """Every run of at least `min_count` identical sibling blocks, in module order (a
    parent's runs before the runs inside its blocks)."""
    by_path = {m["path"]: m for m in modules}
    children = _children(modules, by_path)
    inside = _subtrees(modules, nodes, by_path)
    folds: list[Fold] = []
    for parent, kids in children.items():
        for run in _runs(kids, children, inside, by_path):
            if len(run) >= min_count:
                folds.append(_fold(parent, run, by_path))
    return folds


def _parent_of(module: Json, by_path: Mapping[str, Json]) -> str | None:
    path = module["path"]
    if path == "":
        return None
    parent = module.get("parent")
    if parent is None or parent not in by_path:
        parent = path.rsplit(".", 1)[0] if "." in path else ""
    return parent if parent != path else None


def _children(modules: Sequence[Json], by_path: Mapping[str, Json]) -> dict[str, list[str]]:
    children: dict[str, list[str]] = defaultdict(list)
    for m in modules:
        parent = _parent_of(m, by_path)
        if parent is not None:
            children[parent].append(m["path"])
    return children


@dataclass
class _Subtree:
    modules: list[Json]
    nodes: list[Json]


def _subtrees(
    modules: Sequence[Json], nodes: Sequence[Json], by_path: Mapping[str, Json]
) -> dict[str, _Subtree]:
    """{path: the modules and nodes at or under it}, each list in report order."""
    inside = {m["path"]: _Subtree([], []) for m in modules}
    for m in modules:
        for p in _chain(m["path"], by_path):
            inside[p].modules.append(m)
    for n in nodes:
        for p in _chain(n.get("module_path") or "", by_path):
            inside[p].nodes.append(n)
    return inside


def _chain(path: str, by_path: Mapping[str, Json]) -> Iterable[str]:
    """The known modules from `path` up to (not including) the root: a.b.c, a.b, a."""
    while path:
        if path in by_path:
            yield path
        path = path.rsplit(".", 1)[0] if "." in path else ""


def _runs(
    kids: list[str],
    children: Mapping[str, list[str]],
    inside: Mapping[str, _Subtree],
    by_path: Mapping[str, Json],
) -> Iterable[list[str]]:
    """Maximal runs of consecutive blocks with equal signatures (leaves are no blocks:
    Llama's gate_proj and up_proj are alike but are not a stack). A signature is made only
    for a block beside one of its type (the root's lone `model` would cost the most)."""
    kinds = [by_path[p].get("type") for p in kids]
    run: list[str] = []
    last: str | None = None
    for i, path in enumerate(kids):
        paired = kinds[i] in kinds[max(i - 1, 0) : i] + kinds[i + 1 : i + 2]
        sig = _signature(path, inside[path]) if paired and children.get(path) else None
        if sig is not None and sig == last:
            run.append(path)
            continue
        yield run
        run, last = ([path], sig) if sig is not None else ([], None)
    yield run


def _signature(path: str, sub: _Subtree) -> str:
    """The block's insides with its own path taken out, as comparable text."""
    index = {n["id"]: i for i, n in enumerate(sub.nodes)}
    mods = [
        [_rel(m["path"], path), m.get("type"), m.get("input_shapes"), m.get("output_shapes"),
         m.get("output_dtypes"), m.get("params"), m.get("own_params"), m.get("buffers")]
        for m in sub.modules
    ]  # fmt: skip
    ops = [
        [_rel(n.get("module_path") or "", path), n.get("op"), _target(n, path),
         [_tensor(t) for t in n.get("output_tensors") or []],
         [index.get(i, "ext") for i in n.get("inputs") or []]]
        for n in sub.nodes
    ]  # fmt: skip
    return json.dumps([mods, ops], separators=(",", ":"))


def _rel(text: str, path: str) -> str:
    if text == path or text.startswith(f"{path}."):
        return "~" + text[len(path) :]
    return text


def _target(node: Json, path: str) -> str:
    target = _rel(str(node.get("target")), path)
    # fx numbers the constants it lifts onto the model (`_tensor_constant4`): each block
    # reads its own, so an attribute outside the block counts by its shape alone.
    if node.get("op") == "get_attr" and not target.startswith("~"):
        return "(outside)"
    return target


def _tensor(t: Json) -> list[Any]:
    shape = t.get("shape") or []
    sym = t.get("sym_shape")
    return [sym if sym and len(sym) == len(shape) else shape, t.get("dtype")]


def _fold(parent: str, run: list[str], by_path: Mapping[str, Json]) -> Fold:
    blocks = [by_path[p] for p in run]
    kind = blocks[0].get("type") or "module"
    per_block, total = {}, {}
    for key in MEASURES:
        values = [b.get(key) for b in blocks]
        known = [v for v in values if v is not None]
        per_block[key] = values[0] if len(set(values)) == 1 else None
        total[key] = sum(known) if known else None
    return Fold(
        id=fold_id(run), parent=parent, type=kind, paths=run, label=f"{kind} × {len(run)}",
        per_block=per_block, total=total,
    )  # fmt: skip
