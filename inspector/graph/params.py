"""Parameters and buffers: who owns each tensor, tied ones counted once.

A tensor reachable under several names (a tied LM head) belongs to its first name in
`named_parameters(remove_duplicate=False)` order; the later names are aliases, listed in
`tied_params` of their module and counted nowhere else, so module sums add up.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn

from inspector.graph.tensors import nbytes

__all__ = ["ParamTable", "param_table", "subtree_sums"]


def subtree_sums(own: dict[str, int]) -> dict[str, int]:
    """{path: the values of the path and of every path under it}, from each path's own
    value: linear in the entries (times the depth), not modules x entries."""
    total: dict[str, int] = defaultdict(int)
    for path, value in own.items():
        parts = path.split(".") if path else []
        for k in range(len(parts) + 1):
            total[".".join(parts[:k])] += value
    return total


def _owner(name: str) -> str:
    return name.rpartition(".")[0]


@dataclass
class ParamTable:
    params: dict[str, torch.Tensor] = field(default_factory=dict)  # canonical name -> param
    aliases: dict[str, str] = field(default_factory=dict)  # alias name -> canonical name
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    def sums(self) -> dict[str, dict[str, int]]:
        """Per module path, with everything under it: params, trainable, bytes, buffers;
        and own_params, the module's own parameters only."""
        own: dict[str, dict[str, int]] = {k: defaultdict(int) for k in _SUMS}
        for name, p in self.params.items():
            owner = _owner(name)
            own["params"][owner] += p.numel()
            own["trainable"][owner] += p.numel() if p.requires_grad else 0
            own["bytes"][owner] += nbytes(p)
        for name, b in self.buffers.items():
            own["buffers"][_owner(name)] += b.numel()
        out = {k: subtree_sums(v) for k, v in own.items()}
        out["own_params"] = own["params"]
        return out

    def by_dtype(self) -> tuple[dict[str, int], dict[str, int]]:
        counts: dict[str, int] = defaultdict(int)
        sizes: dict[str, int] = defaultdict(int)
        for p in self.params.values():
            dtype = str(p.dtype).removeprefix("torch.")
            counts[dtype] += p.numel()
            sizes[dtype] += nbytes(p)
        return dict(counts), dict(sizes)


_SUMS = ("params", "trainable", "bytes", "buffers")


def param_table(model: nn.Module) -> ParamTable:
    table = ParamTable()
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            table.aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
            table.params[name] = p
    seen: set[int] = set()
    for name, b in model.named_buffers(remove_duplicate=False):
        if b is not None and id(b) not in seen:
            seen.add(id(b))
            table.buffers[name] = b
    return table
