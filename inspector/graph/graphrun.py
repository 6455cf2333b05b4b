"""Run an fx / export graph node by node, recording tensors, FLOPs and params per node.

Real or fake: the caller enters the fake mode. FLOPs come from one FlopCounterMode around
the whole run, read before and after each node (torch's own per-op formulas).
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext
from typing import Any

import torch
from torch import fx, nn
from torch.fx.node import _get_qualified_name
from torch.utils.flop_counter import FlopCounterMode

from inspector.graph.backflops import (
    TrainingFlopCounter,
    attention_backward,
    fused_layout,
    is_attention,
)
from inspector.graph.flops import forward_flop_counter
from inspector.graph.metarun import on_meta_device
from inspector.graph.records import NodeRecord, user_location_from_stack
from inspector.graph.tensors import nbytes, tensor_info, tensor_leaves

__all__ = ["record_graph", "node_target"]


def node_target(node: fx.Node) -> str:
    if node.op == "call_function":
        return (
            str(node.target)
            if isinstance(node.target, torch._ops.OpOverload)
            else (_get_qualified_name(node.target))
        )
    return str(node.target)


class _Recorder(fx.Interpreter):
    def __init__(
        self,
        gm: fx.GraphModule,
        counter: FlopCounterMode | TrainingFlopCounter | None,
        user_files: list[str],
        strip: str | None,
        meta_for: torch.device | None = None,
        watch: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.watch = watch  # node name -> its value in this run, for the names it holds
        self.extra_traceback = False  # errors keep their message; we name the node ourselves
        self.counter = counter
        self.meta_for = meta_for  # a meta run standing for this device
        self.user_files = user_files
        self.strip = strip  # module path prefix of a wrapper to remove (export)
        self.records: list[NodeRecord] = []
        self.index: dict[fx.Node, int] = {}
        # tensors already counted, held weakly: a freed tensor's id may come back
        self.seen: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

    def _flops(self) -> tuple[int, int]:
        if isinstance(self.counter, TrainingFlopCounter):
            return self.counter.forward_total, self.counter.backward_total
        return (self.counter.get_total_flops() if self.counter is not None else 0), 0

    def run_node(self, n: fx.Node) -> Any:
        with self._set_current_node(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            if self.meta_for is not None:  # graphs bake the device in: arange(device=cpu)
                method = n.target if n.op == "call_method" else None
                args, kwargs = on_meta_device(method, args, kwargs, self.meta_for)
            before = self._flops()
            try:
                out = getattr(self, n.op)(n.target, args, kwargs)
            except Exception as exc:  # name the node and its module for the user
                calls = _calls(n, self.strip)
                exc.inspector_where = f"node {n.name}" + (  # type: ignore[attr-defined]
                    f" in module '{calls[-1][1]}'" if calls else ""
                )
                exc.inspector_location = user_location_from_stack(  # type: ignore[attr-defined]
                    n.meta.get("stack_trace"), self.user_files
                )
                raise
            (fwd, bwd), (fwd0, bwd0) = self._flops(), before
            backward = bwd - bwd0
            if self.meta_for is not None and n.op == "call_function" and is_attention(n.target):
                fused = attention_backward(self.meta_for, out, args, kwargs)
                if fused is not None:  # meta ran the math path: take the kernel's layout
                    backward, out = fused, fused_layout(out)
            self._record(n, args, kwargs, out, fwd - fwd0, backward)
            if self.watch is not None and n.name in self.watch:
                self.watch[n.name] = out
            return out

    def _record(
        self, n: fx.Node, args: Any, kwargs: Any, out: Any, flops: int, backward: int
    ) -> None:
        ins = tensor_leaves((args, kwargs))
        outs = [] if n.op == "output" else tensor_leaves(out)
        calls = _calls(n, self.strip)
        rec = NodeRecord(
            name=n.name,
            op=n.op,
            target=node_target(n),
            module_path=calls[-1][1] if calls else "",
            calls=calls,
            inputs=[self.index[a] for a in n.all_input_nodes if a in self.index],
            in_tensors=[tensor_info(t, self.meta_for) for t in ins],
            out_tensors=[tensor_info(t, self.meta_for) for t in outs],
            output_bytes=self._new_bytes(outs),
            params=self._params(n, ins),
            flops=flops,
            flops_backward=backward,
            location=user_location_from_stack(n.meta.get("stack_trace"), self.user_files),
        )
        self.index[n] = len(self.records)
        self.records.append(rec)

    def _new_bytes(self, outs: list[torch.Tensor]) -> int:
        total = 0
        for t in outs:  # a getitem hands on a tensor an earlier node made: count it once
            if self.seen.get(id(t)) is not t:
                self.seen[id(t)] = t
                total += nbytes(t)
        return total

    def _params(self, n: fx.Node, ins: list[torch.Tensor]) -> int:
        if n.op == "call_module":
            ins = list(self.module.get_submodule(n.target).parameters())
        unique = {id(t): t for t in ins if isinstance(t, nn.Parameter)}
        return sum(t.numel() for t in unique.values())


def _calls(n: fx.Node, strip: str | None) -> list[tuple[str, str]]:
    """(call key, module path) of the modules this node runs in, outer first; root left out."""
    stack = n.meta.get("nn_module_stack") or {}
    out = []
    for key, (path, _type) in stack.items():
        if strip is not None:
            if path == "" or path == strip:
                continue  # the wrapper, or the user's root
            path = path.removeprefix(strip + ".")
        if path:
            out.append((str(key), path))
    return out


def record_graph(
    gm: fx.GraphModule,
    flat_inputs: list[Any],
    *,
    count_flops: bool = True,
    user_files: list[str] | None = None,
    strip: str | None = None,
    training: bool = False,
    meta_for: torch.device | None = None,
    watch: dict[str, Any] | None = None,
) -> list[NodeRecord]:
    """Run `gm` on its placeholder values `flat_inputs`; one record per node.

    `training`: run with grad enabled and count each node's backward FLOPs from the
    forward ops (`TrainingFlopCounter`; only for fake or meta tensors, which keep no
    activations); `flops_backward` is None on every record when an op had no backward
    rule. `meta_for`: the inputs are meta tensors standing for that device. `watch`: the
    values of the nodes it names are put in it."""
    counter: FlopCounterMode | TrainingFlopCounter | None = None
    if training:
        counter = TrainingFlopCounter()
    elif count_flops:
        counter = forward_flop_counter()
    recorder = _Recorder(gm, counter, list(user_files or []), strip, meta_for, watch)
    grad = torch.enable_grad() if training else torch.no_grad()
    with grad, counter if counter is not None else nullcontext():
        recorder.run(*flat_inputs)
    if isinstance(counter, TrainingFlopCounter) and counter.unknown:
        for rec in recorder.records:  # an op with no backward rule: measure it instead
            rec.flops_backward = None
    return recorder.records
