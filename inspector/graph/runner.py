"""One recording run of the captured model, whatever the capture method.

The main run uses the captured graph on the context's inputs (real or fake); the runs
with perturbed dims (symbolic shapes) call the same function with fake inputs. An fx
graph is shape-generic and is re-run, and so is a symbolic export graph; a static
one bakes its shapes in, so it is exported again; hooks simply run the model again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from inspector.context import Context, Inputs
from inspector.graph.exportcapture import export_graph, flat_tensors
from inspector.graph.fxcapture import fx_placeholder_values
from inspector.graph.graphrun import record_graph
from inspector.graph.hooks import record_hooks
from inspector.graph.lenient import fake_context, new_fake_mode
from inspector.graph.metarun import run_on_meta, single_device, to_meta
from inspector.graph.records import NodeRecord

__all__ = ["record_run", "record_meta", "perturb_fake_mode", "preserved_state"]


def record_run(
    ctx: Context,
    inputs: Inputs,
    fake_mode: Any,
    *,
    main: bool = True,
    count_flops: bool = True,
    watch: dict[str, Any] | None = None,
) -> list[NodeRecord]:
    """Records of one run of `ctx.capture` on `inputs` (under `fake_mode` when not None);
    `watch`: see record_graph (graph captures only)."""
    method = ctx.capture.method if ctx.capture else None
    model, files = ctx.model, ctx.loaded.user_files
    if method == "fx":
        gm = ctx.capture.graph_module
        values = fx_placeholder_values(gm, model, inputs.args, inputs.kwargs)
        with fake_context(fake_mode):
            return record_graph(gm, values, count_flops=count_flops, user_files=files, watch=watch)
    if method == "export":
        gm = ctx.capture.graph_module
        if not main and ctx.capture.reexport:
            # a static export bakes its shapes in: export again at these dims
            _, gm = export_graph(
                model, inputs.args, inputs.kwargs, fake_mode,
                stack_traces=ctx.capture.stack_traces,
            )  # fmt: skip
        strip = ctx.capture.strip
        flat = flat_tensors(inputs.args, inputs.kwargs)
        with fake_context(fake_mode):
            return record_graph(
                gm, flat, count_flops=count_flops, user_files=files, strip=strip, watch=watch
            )
    if method == "hooks":
        with fake_context(fake_mode):
            return record_hooks(
                model, lambda: inputs.call(model), count_flops=count_flops, user_files=files
            )
    return []


def record_meta(
    ctx: Context,
    inputs: Inputs,
    *,
    main: bool = True,
    training: bool = False,
    watch: dict[str, Any] | None = None,
) -> list[NodeRecord]:
    """`record_run` on meta copies of the inputs and of the graph's tensors (see
    `metarun`): no arithmetic, nothing allocated. Raises where meta cannot stand in: the
    model needs values, mixes devices, or (a static export) must be exported again."""
    method = ctx.capture.method if ctx.capture else None
    gm = ctx.capture.graph_module if ctx.capture else None
    strip = None
    if method == "fx":
        values = fx_placeholder_values(gm, ctx.model, inputs.args, inputs.kwargs)
    elif method == "export" and (main or not ctx.capture.reexport):
        values = flat_tensors(inputs.args, inputs.kwargs)
        strip = ctx.capture.strip
    else:
        raise ValueError(f"no meta run for a {method} capture here")
    device = single_device(gm, values)
    if device is None:
        raise ValueError("the model's tensors are on several devices")
    meta_values = to_meta(values)
    files = ctx.loaded.user_files
    return run_on_meta(
        gm,
        lambda: record_graph(
            gm, meta_values, count_flops=main, user_files=files, strip=strip,
            training=training, meta_for=device, watch=watch,
        ),
    )  # fmt: skip


def perturb_fake_mode(ctx: Context) -> Any:
    """The fake mode of the extra runs: the context's, or one made once for a real run."""
    if ctx.fake_mode is not None:
        return ctx.fake_mode
    if ctx.extra_fake_mode is None:
        ctx.extra_fake_mode = new_fake_mode()
    return ctx.extra_fake_mode


@contextmanager
def preserved_state(model: nn.Module, real: bool) -> Iterator[None]:
    """A real training-mode run updates BatchNorm statistics, and a fake backward leaves
    fake `.grad`s on real parameters: put both back as they were."""
    buffers = {}
    if real:
        buffers = {n: b.detach().clone() for n, b in model.named_buffers() if b is not None}
    grads = {id(p): (p, p.grad) for p in model.parameters()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, saved in buffers.items():
                _buffer(model, name).copy_(saved)
        for p, grad in grads.values():
            p.grad = grad


def _buffer(model: nn.Module, name: str) -> torch.Tensor:
    owner, _, leaf = name.rpartition(".")
    return getattr(model.get_submodule(owner) if owner else model, leaf)
