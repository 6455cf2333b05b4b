"""Per graph node: the bytes it leaves saved for backward and the live bytes after it.

The fx graph is run node by node (`torch.fx.Interpreter`, which frees each value after its
last use, as eager code does) under the live tracker, so every storage is attributed to the
node that produced it. Forward only: what is saved and what is live is known by then.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import fx

from inspector.context import Inputs
from inspector.memory.saved import SavedTracker
from inspector.memory.step import INPUT_LABEL, StepOptions, _autocast, unique_tensors
from inspector.memory.tracker import LiveTracker, storage_key

__all__ = ["NodeMemory", "node_memory"]


@dataclass
class NodeMemory:
    saved_bytes: dict[str, int] = field(default_factory=dict)  # node name -> bytes
    live_after: dict[str, int] = field(default_factory=dict)  # node name -> activation bytes


class _Runner(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, tracker: LiveTracker, static: int) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.tracker, self.static = tracker, static
        self.previous: str | None = None
        self.live_after: dict[str, int] = {}

    def run_node(self, n: fx.Node):  # noqa: ANN201
        self._close_previous()
        self.tracker.label = n.name
        out = super().run_node(n)
        if n.op == "placeholder" and isinstance(out, torch.Tensor):
            entry = self.tracker.producer_of(out)
            if entry is not None and entry.producer == INPUT_LABEL:
                entry.producer = n.name
        self.previous = n.name
        return out

    def _close_previous(self) -> None:
        # Values dead after the previous node are freed by now.
        if self.previous is not None:
            self.live_after[self.previous] = self.tracker.live - self.static


def node_memory(gm: fx.GraphModule, inputs: Inputs, opts: StepOptions) -> NodeMemory:
    """Run `gm` (a shadow: it is put in train mode) forward with grad, node by node."""
    gm.train()
    tracker = LiveTracker(round_to=opts.round_to)
    state = unique_tensors([*gm.parameters(), *gm.buffers()])
    for t in state:
        tracker.add(t, "static", "(parameters)")
    static = tracker.live
    tracker.add_all(inputs.tensors(), "input", INPUT_LABEL)
    bound = inspect.signature(gm.forward).bind(*inputs.args, **inputs.kwargs)
    runner = _Runner(gm, tracker, static)
    exclude = {storage_key(t) for t in state}
    with opts.fake_mode or nullcontext(), tracker:
        with SavedTracker(tracker, exclude) as saved, _autocast(opts):
            output = runner.run(*bound.args)
        runner._close_previous()
        del output
    saved_by = {k: v for k, v in saved.by_producer().items() if k is not None}
    return NodeMemory(saved_bytes=saved_by, live_after=runner.live_after)
