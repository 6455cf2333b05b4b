"""The module tree with per-module measures aggregated from the node records.

A module call is a group of nodes sharing a call key of `nn_module_stack` (hooks: one
record). Its inputs are tensors made outside the group and read inside it; its outputs
are tensors made inside and read after it. FLOPs, output bytes: sums over the nodes the
module owns, so the root equals the totals and children add up to their parent minus
its own nodes.
"""

from __future__ import annotations

import inspect
import linecache
import os
import re
from collections import defaultdict
from functools import lru_cache

from torch import nn

from inspector.graph.params import ParamTable, subtree_sums
from inspector.graph.records import ModuleCall, NodeRecord
from inspector.report import Module, Shape, TensorInfo

__all__ = ["module_calls", "build_modules"]


def module_calls(records: list[NodeRecord], hooks: bool) -> dict[str, list[ModuleCall]]:
    """{module path: its calls in order}."""
    calls: dict[str, list[ModuleCall]] = defaultdict(list)
    if hooks:
        for rec in records:
            calls[rec.module_path or ""].append(
                ModuleCall(rec.module_path or "", rec.in_tensors, rec.out_tensors)
            )
        return calls
    groups: dict[str, list[int]] = defaultdict(list)
    paths: dict[str, str] = {}
    for i, rec in enumerate(records):
        for key, path in rec.calls:
            groups[key].append(i)
            paths[key] = path
    users = _users(records)
    for key, members in groups.items():
        calls[paths[key]].append(_call(paths[key], members, records, users))
    calls[""] = [_root_call(records)]
    return calls


def _users(records: list[NodeRecord]) -> list[list[int]]:
    users: list[list[int]] = [[] for _ in records]
    for i, rec in enumerate(records):
        for j in rec.inputs:
            users[j].append(i)
    return users


def _call(path: str, members: list[int], records: list[NodeRecord], users) -> ModuleCall:
    if len(members) == 1:  # a leaf call_module: its own tensors
        rec = records[members[0]]
        return ModuleCall(path, rec.in_tensors, rec.out_tensors)
    inside = set(members)
    sources: list[int] = []
    for i in members:
        for j in records[i].inputs:
            if j not in inside and j not in sources and records[j].op != "get_attr":
                sources.append(j)
    ins = [t for j in sources for t in records[j].out_tensors]
    outs = [
        t for i in members if any(u not in inside for u in users[i]) for t in records[i].out_tensors
    ]
    return ModuleCall(path, ins, outs)


def _root_call(records: list[NodeRecord]) -> ModuleCall:
    ins = [t for r in records if r.op == "placeholder" for t in r.out_tensors]
    outs = [t for r in records if r.op == "output" for t in r.in_tensors]
    return ModuleCall("", ins, outs)


def _shape(t: TensorInfo) -> Shape:
    return list(t.sym_shape) if t.sym_shape is not None else list(t.shape)


@lru_cache(maxsize=1024)
def _class_location(cls: type) -> str | None:
    """file:line of `class Name` (a line scan: inspect.getsourcelines parses the file)."""
    try:
        file = inspect.getsourcefile(cls)
    except TypeError:  # built-in
        return None
    if not file:
        return None
    pattern = re.compile(rf"^\s*class\s+{re.escape(cls.__name__)}\b")
    for number, line in enumerate(linecache.getlines(file), 1):
        if pattern.match(line):
            return f"{os.path.basename(file)}:{number}"
    return None


def build_modules(
    model: nn.Module,
    records: list[NodeRecord],
    calls: dict[str, list[ModuleCall]],
    table: ParamTable,
    backward: dict[str, int],
) -> list[Module]:
    """One Module per entry of `named_modules()` (shared submodules once), root first."""
    flops: dict[str, int] = defaultdict(int)
    out_bytes: dict[str, int] = defaultdict(int)
    for rec in records:
        flops[rec.module_path or ""] += rec.flops
        out_bytes[rec.module_path or ""] += rec.output_bytes
    flops, out_bytes = subtree_sums(flops), subtree_sums(out_bytes)
    sums = table.sums()
    tied: dict[str, list[str]] = defaultdict(list)
    for alias in table.aliases:
        tied[alias.rpartition(".")[0]].append(alias)
    out = []
    for path, module in model.named_modules():
        out.append(_module(path, module, calls.get(path, []), sums, tied[path], backward))
        out[-1].flops_forward = flops.get(path, 0)
        out[-1].output_bytes = out_bytes.get(path, 0)
    _fill_uncalled_backward(out, backward)
    return out


def _fill_uncalled_backward(modules: list[Module], backward: dict[str, int]) -> None:
    """A container that is never called (ModuleList) has no backward FLOPs of its own:
    it gets its children's sum. Children come after parents in `named_modules` order."""
    by_parent: dict[str, int] = defaultdict(int)
    for m in reversed(modules):
        if m.path not in backward:
            m.flops_backward = by_parent[m.path]
        if m.parent is not None:
            by_parent[m.parent] += m.flops_backward


def _module(
    path: str,
    module: nn.Module,
    calls: list[ModuleCall],
    sums: dict[str, dict[str, int]],
    tied: list[str],
    bwd: dict,
) -> Module:
    first = calls[0] if calls else None
    return Module(
        path=path,
        type=type(module).__name__,
        depth=0 if not path else path.count(".") + 1,
        parent=None if not path else path.rpartition(".")[0],
        input_shapes=[_shape(t) for t in first.in_tensors] if first else [],
        output_shapes=[_shape(t) for t in first.out_tensors] if first else [],
        output_dtypes=[t.dtype for t in first.out_tensors] if first else [],
        params=sums["params"].get(path, 0),
        trainable_params=sums["trainable"].get(path, 0),
        own_params=sums["own_params"].get(path, 0),
        buffers=sums["buffers"].get(path, 0),
        param_bytes=sums["bytes"].get(path, 0),
        tied_params=tied,
        calls=len(calls),
        flops_backward=bwd.get(path, 0),
        location=_class_location(type(module)),
    )
