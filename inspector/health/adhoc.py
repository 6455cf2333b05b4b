"""A Context for an in-memory model and inputs, with a minimal capture (fx, else module
calls). For tests and notebooks: the value passes run on it without the load and graph
stages, matching nodes by name exactly as they do on a full pipeline's report."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from inspector.context import CaptureResult, Context, InputFactory, Inputs, LoadedModel, Options
from inspector.graph.fxcapture import constants_left_off, trace_undone
from inspector.health.locate import is_user_file
from inspector.health.state import preserved
from inspector.report import CaptureAttempt, Module, Node, Report

__all__ = ["context_for"]


class _Fixed(InputFactory):
    def __init__(self, inputs: Inputs) -> None:
        super().__init__()
        self.inputs = inputs

    def build(self, dims: dict[str, int] | None = None, device: str = "cpu") -> Inputs:
        return self.inputs


def context_for(
    model: nn.Module,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    options: Options | None = None,
    loss_fn: Callable[[Any, Inputs], torch.Tensor] | None = None,
    capture: str = "fx",
    user_files: Sequence[str] = (),
) -> Context:
    """capture: "fx" (fall back to module calls when tracing fails) or "hooks"."""
    inputs = Inputs(args=tuple(args), kwargs=dict(kwargs or {}))
    loaded = LoadedModel(
        model, "python", type(model).__name__, loss_fn=loss_fn, user_files=list(user_files)
    )
    report = Report(modules=_modules(model))
    ctx = Context(loaded, _Fixed(inputs), inputs, options or Options(), report)
    ctx.capture = _fx(ctx) if capture == "fx" else None
    if ctx.capture is None:
        tried = report.capture.attempts + [CaptureAttempt(method="hooks", ok=True)]
        ctx.capture = CaptureResult("hooks", tried)
        report.nodes = _module_nodes(model, inputs)
    report.capture.method = ctx.capture.method
    report.capture.attempts = ctx.capture.attempts
    return ctx


def _modules(model: nn.Module) -> list[Module]:
    return [
        Module(
            path=p,
            type=type(m).__name__,
            depth=p.count(".") + 1 if p else 0,
            params=sum(x.numel() for x in m.parameters()),
        )
        for p, m in model.named_modules()
    ]


def _fx(ctx: Context) -> CaptureResult | None:
    try:
        tracer = torch.fx.Tracer()
        tracer.record_stack_traces = True  # node locations in the user's code
        with constants_left_off(ctx.model):
            with trace_undone(ctx.model):
                graph = tracer.trace(ctx.model)
            gm = torch.fx.GraphModule(tracer.root, graph)
    except Exception as exc:  # noqa: BLE001 - any tracing failure means: use hooks
        ctx.report.capture.attempts = [CaptureAttempt(method="fx", ok=False, error=str(exc))]
        return None
    nodes = []
    for i, n in enumerate(gm.graph.nodes):
        stack = n.meta.get("nn_module_stack") or {}
        path = n.target if n.op == "call_module" else (list(stack)[-1] if stack else "")
        node = Node(id=i, name=n.name, op=n.op, target=_target(n), module_path=path)
        node.location = _location(n.meta.get("stack_trace"), ctx.loaded.user_files)
        nodes.append(node)
    ctx.report.nodes = nodes
    return CaptureResult("fx", [CaptureAttempt(method="fx", ok=True)], graph_module=gm)


def _module_nodes(model: nn.Module, inputs: Inputs) -> list[Node]:
    order: list[tuple[str, str]] = []
    handles = [
        m.register_forward_hook(lambda mod, a, o, p=p: order.append((p, type(mod).__name__)))
        for p, m in model.named_modules()
    ]
    try:
        with preserved(model), torch.no_grad():
            inputs.call(model)
    finally:
        for handle in handles:
            handle.remove()
    seen: dict[str, int] = {}
    nodes = []
    for i, (path, type_name) in enumerate(order):
        k = seen[path] = seen.get(path, -1) + 1
        name = (path or "model") + (f"@{k}" if k else "")  # as inspector.graph.hooks
        nodes.append(
            Node(
                id=i,
                name=name,
                op="module",
                target=type_name,
                module_path=path,
                module_type=type_name,
            )
        )
    return nodes


def _target(node: torch.fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")


def _location(stack: str | None, user_files: Sequence[str]) -> str | None:
    """The innermost user frame of an fx stack trace, as "file.py:LINE"."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', stack or "")
    frames = [(f, n) for f, n in frames if is_user_file(f, user_files)]
    return f"{os.path.basename(frames[-1][0])}:{frames[-1][1]}" if frames else None
