"""Backward FLOPs, measured: one fake forward + backward under FlopCounterMode.

Fake tensors make it cheap (no arithmetic); torch's per-op formulas count the backward
kernels. Per module: each op goes to the innermost module FlopCounterMode's tracker has open.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.module_tracker import ModuleTracker

from inspector.context import Inputs
from inspector.graph.flops import EXTRA_FORMULAS
from inspector.graph.lenient import fake_context
from inspector.graph.params import subtree_sums
from inspector.graph.tensors import tensor_leaves

__all__ = ["measure_backward"]


class _EnteredInOrder(dict):
    """A set of module names that keeps the order they were entered in."""

    def add(self, name: str) -> None:
        self.pop(name, None)
        self[name] = None

    def remove(self, name: str) -> None:
        del self[name]


class _OrderedTracker(ModuleTracker):
    """torch's tracker of the open modules, their set kept in the order they were
    entered: its own set's order is its strings' hashes', which change from one process to
    the next, and with it which module a tie went to (RetinaNet's per-module backward
    FLOPs differed between two runs of the same report)."""

    @property
    def parents(self) -> _EnteredInOrder:
        return self._entered

    @parents.setter
    def parents(self, names: Any) -> None:
        self._entered = _EnteredInOrder.fromkeys(names)


class _OwnCounter(FlopCounterMode):
    """Also attributes each op to its innermost module only, so per-module sums add up
    (torch's inclusive per-module counts are not always nested in backward)."""

    def __init__(self) -> None:
        super().__init__(display=False, custom_mapping=EXTRA_FORMULAS)
        self.own: dict[str, int] = defaultdict(int)
        if type(self.mod_tracker) is ModuleTracker:
            self.mod_tracker = _OrderedTracker()

    def _count_flops(self, func_packet, out, args, kwargs):  # noqa: ANN001, ANN202
        before = self.get_total_flops()
        result = super()._count_flops(func_packet, out, args, kwargs)
        delta = self.get_total_flops() - before
        if delta:
            # the deepest open module; among as deep ones (a backward leaves a module open
            # whose inputs need no grad) the last entered: the one whose backward runs
            names = [p for p in self.mod_tracker.parents if p != "Global"]
            self.own[max(reversed(names), key=lambda n: n.count("."), default="")] += delta
        return result

    def per_module(self, root: nn.Module) -> dict[str, int]:
        """{module path: own FLOPs so far}; the tracker names modules "RootClass.path"."""
        prefix = type(root).__name__
        out: dict[str, int] = defaultdict(int)
        for name, flops in self.own.items():
            out["" if name in ("", prefix) else name.removeprefix(prefix + ".")] += flops
        return out


def measure_backward(
    model: nn.Module, inputs: Inputs, fake_mode: Any
) -> tuple[int, dict[str, int]]:
    """(total backward FLOPs, {module path: backward FLOPs}). Raises when the model's
    output has nothing to differentiate."""
    counter = _OwnCounter()
    with fake_context(fake_mode), counter:
        out = inputs.call(model)
        fwd_total, fwd = counter.get_total_flops(), dict(counter.per_module(model))
        grads = [t for t in tensor_leaves(out) if t.requires_grad and t.is_floating_point()]
        if not grads:
            raise ValueError("no floating output requires grad (every parameter frozen?)")
        loss = sum(t.float().sum() for t in grads)
        loss.backward()  # type: ignore[union-attr]
        total, both = counter.get_total_flops(), counter.per_module(model)
    own = {p: both[p] - fwd.get(p, 0) for p in both}
    return total - fwd_total, _inclusive(own, model)


def _inclusive(own: dict[str, int], model: nn.Module) -> dict[str, int]:
    """{path: FLOPs of the module and everything under it}."""
    sums = subtree_sums(own)
    return {path: sums.get(path, 0) for path, _ in model.named_modules()}
