"""torch.export.export, non-strict, on a wrapper that flattens inputs and outputs.

Non-strict export runs the model's Python as it is (with fake tensors) instead of
compiling it with Dynamo: arbitrary Python in forward is fine, and it is faster. The
wrapper takes the input tensors positionally (non-tensor inputs stay constants) and
returns every tensor of the output as a tuple, because export refuses outputs pytree
does not know (Hugging Face caches in GPT-2's output).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import fx, nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from inspector.graph.tensors import tensor_leaves
from inspector.libraryoutput import Printed, attach_printed, library_output_captured

__all__ = [
    "WRAPPED",
    "Flat",
    "export_graph",
    "flat_tensors",
    "lazy_recompiles",
    "moving_axes",
    "node_stacks",
]

WRAPPED = "model"  # the user's model inside the wrapper: module paths start with it


class Flat(nn.Module):
    def __init__(self, model: nn.Module, args: tuple, kwargs: dict) -> None:
        super().__init__()
        self.model = model
        leaves, self._spec = tree_flatten((args, kwargs))
        self._positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        self._leaves = [None if isinstance(v, torch.Tensor) else v for v in leaves]

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(tensor_leaves(self.call_model(tensors)))

    def call_model(self, tensors: tuple) -> Any:
        """The model on the inputs with their tensors replaced by `tensors`, in order."""
        leaves = list(self._leaves)
        for pos, t in zip(self._positions, tensors, strict=True):
            leaves[pos] = t
        args, kwargs = tree_unflatten(leaves, self._spec)
        return self.model(*args, **kwargs)


def flat_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    leaves, _ = tree_flatten((args, kwargs))
    return [v for v in leaves if isinstance(v, torch.Tensor)]


def export_graph(
    model: nn.Module,
    args: tuple,
    kwargs: dict,
    fake_mode: Any = None,
    dynamic: list[list[int]] | None = None,
    guards: bool = True,
    stack_traces: bool = True,
) -> tuple[Any, fx.GraphModule]:
    """(ExportedProgram, its runnable GraphModule) for `model(*args, **kwargs)`; under
    `fake_mode` when the model or inputs are fake. `dynamic[i]` lists the axes of the
    i-th input tensor left symbolic (Dim.AUTO: export keeps them symbolic where the
    model allows and specializes them silently where it does not). `guards=False` gives
    a module that runs on inputs outside the exported ranges (a graph exported at B=2
    run at B=1)."""
    wrapper = Flat(model, args, kwargs)
    tensors = tuple(flat_tensors(args, kwargs))
    shapes = None
    if dynamic and any(dynamic):
        auto = torch.export.Dim.AUTO
        shapes = {"tensors": tuple({axis: auto for axis in axes} for axes in dynamic)}
    with _quiet(), node_stacks(stack_traces), fake_mode if fake_mode is not None else nullcontext():
        ep = torch.export.export(wrapper, tensors, strict=False, dynamic_shapes=shapes)
        if guards:
            return ep, ep.module()
        gm = ep.module(check_guards=False)
        gm._forward_pre_hooks.clear()  # the remaining input-range checks
        return ep, gm


def moving_axes(base: list[torch.Tensor], others: list[list[torch.Tensor]]) -> list[list[int]]:
    """For each input tensor, the axes whose size differs in any of `others` (the same
    inputs built with one named dim changed)."""
    out = []
    for i, t in enumerate(base):
        axes = {
            a
            for other in others
            if i < len(other) and other[i].dim() == t.dim()
            for a in range(t.dim())
            if other[i].shape[a] != t.shape[a]
        }
        out.append(sorted(axes))
    return out


@contextmanager
def node_stacks(record: bool) -> Iterator[None]:
    """Whether the graphs torch traces meanwhile keep each node's stack (the user's line per
    node): 13% of CaiT's export where nothing reads it."""
    config = getattr(torch.fx, "config", None)  # torch.fx.config: torch >= 2.6
    if record or config is None or not hasattr(config, "do_not_emit_stack_traces"):
        yield
        return
    saved = config.do_not_emit_stack_traces  # a plain module: set and put back
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = saved


def lazy_recompiles() -> AbstractContextManager[None]:
    """torch.export's passes make a graph's Python again after each edit (ten times an
    export: 0.28 s of ViT-B/16's 1.2 s, 0.59 s of CaiT's 3.2 s), code nothing runs or reads
    before the program is done. Within, the graph modules torch makes through
    `_make_graph_module` are its lazy ones (as Dynamo's compile makes them): their code is
    made once, where it is run or read; what torch.export returns is the same."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:  # torch's private module moved: eager recompiles, as before
        return nullcontext()
    return _use_lazy_graph_module(True)


@contextmanager
def _quiet() -> Iterator[None]:
    """A failing export prints its partial graph to stderr (even from loggers holding the
    terminal's stream) and logs warnings: keep it off the terminal, on the exception for
    the capture attempt's message."""
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = logger.level
    logger.setLevel(logging.ERROR)
    out = Printed()
    try:
        with library_output_captured() as out:
            yield
    except BaseException as exc:  # out.text is complete once the capture has ended
        attach_printed(exc, out.text)
        raise
    finally:
        logger.setLevel(level)
