"""Who is running: the module (forward hooks) or graph node whose ops the tracker sees.

Forward: a pre-hook pushes the module's path, a post-hook pops it, so ops are labelled with
the innermost module running. Backward: each autograd node gets the label of the module
that created it (stored in `grad_fn.metadata`), and the tracker reads the node running.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from inspector.memory.tracker import LiveTracker, storage_key

__all__ = ["tag_graph", "module_labels", "Calls", "LABEL_KEY"]

LABEL_KEY = "inspector_label"


def tag_graph(outputs: Any, label: str) -> None:
    """Label every autograd node reachable from `outputs` that has no label yet."""
    stack = [t.grad_fn for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]
    while stack:
        fn = stack.pop()
        if fn is None or LABEL_KEY in fn.metadata:
            continue
        fn.metadata[LABEL_KEY] = label
        stack.extend(nxt for nxt, _ in fn.next_functions)


class Calls:
    """What the hooks saw: module paths in the order their calls ended, and the storages
    of each module's outputs."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.outputs: dict[str, set[int]] = {}
        self.output_bytes: dict[str, int] = {}  # last call's outputs, each storage once


@contextmanager
def module_labels(model: nn.Module, tracker: LiveTracker, tag: bool) -> Iterator[Calls]:
    """Label ops with the innermost module path while `model` runs."""
    order = Calls()
    stack = tracker.modules  # what runs, read by the saved tensors' hook (saved.py)
    stack.clear()
    handles = []
    for path, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(_pre(path, stack, tracker, tag)))
        handles.append(
            module.register_forward_hook(_post(path, stack, tracker, tag, order), always_call=True)
        )
    try:
        yield order
    finally:
        for handle in handles:
            handle.remove()


def _pre(path: str, stack: list[str], tracker: LiveTracker, tag: bool):  # noqa: ANN202
    def hook(module: nn.Module, args: Any) -> None:
        if tag and stack:  # ops before this call belong to the caller
            tag_graph(args, stack[-1])
        stack.append(path)
        tracker.label = path

    return hook


def _post(path: str, stack: list[str], tracker: LiveTracker, tag: bool, calls: Calls):  # noqa: ANN202
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if tag:
            tag_graph(output, path)
        if stack and stack[-1] == path:
            stack.pop()
        tracker.label = stack[-1] if stack else None
        tracker.mark(path)
        calls.order.append(path)
        tensors = {storage_key(t): t for t in tree_leaves(output) if isinstance(t, torch.Tensor)}
        calls.outputs.setdefault(path, set()).update(tensors)
        calls.output_bytes[path] = sum(t.untyped_storage().nbytes() for t in tensors.values())

    return hook
