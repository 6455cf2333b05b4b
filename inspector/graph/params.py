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

__all__ = ["ParamTable", "param_table", "in_subtree"]


def in_subtree(path: str, root: str) -> bool:
    return root == "" or path == root or path.startswith(root + ".")


def _owner(name: str) -> str:
    return name.rpartition(".")[0]


@dataclass
class ParamTable:
    params: dict[str, torch.Tensor] = field(default_factory=dict)  # canonical name -> param
    aliases: dict[str, str] = field(default_factory=dict)  # alias name -> canonical name
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    def owned(self, path: str, recurse: bool = True) -> list[torch.Tensor]:
        return [p for n, p in self.params.items() if _match(_owner(n), path, recurse)]

    def owned_buffers(self, path: str, recurse: bool = True) -> list[torch.Tensor]:
        return [b for n, b in self.buffers.items() if _match(_owner(n), path, recurse)]

    def tied_in(self, path: str) -> list[str]:
        return [a for a in self.aliases if _owner(a) == path]

    def by_dtype(self) -> tuple[dict[str, int], dict[str, int]]:
        counts: dict[str, int] = defaultdict(int)
        sizes: dict[str, int] = defaultdict(int)
        for p in self.params.values():
            dtype = str(p.dtype).removeprefix("torch.")
            counts[dtype] += p.numel()
            sizes[dtype] += nbytes(p)
        return dict(counts), dict(sizes)


def _match(owner: str, path: str, recurse: bool) -> bool:
    return in_subtree(owner, path) if recurse else owner == path


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
