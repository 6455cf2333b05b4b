"""A training step's memory from the graph alone, before the memory pass has estimated it.

The passes that run beside the others start once the graph is known, before the memory
pass (inspector/beside.py); what sizes their room then is not the memory pass's estimate,
which comes later, but bounds from the graph pass's nodes: every node's output alive at
once in a forward; saved for the backward three times over (a max pool's int64 indices
are twice its output), and once more as the activations' gradients; the optimizer's step
making temporaries of twice the gradients. ResNet-18 at
[8, 3, 224, 224]: 234 MB for a forward peak estimated at 98 MB, 1.0 GB for a step
estimated at 338 MB. Where a bound is too large for the machine, the pass waits for the
estimate, as before.

Only where the graph shows every op, or layers kept whole whose inside is bounded too: an
nn.MultiheadAttention's (its projections, the heads' scores and their softmax and dropout,
its output's copies: `_attention_bytes`; ViT-B/16's passes beside then start with the
graph, 0.8 s before its memory pass is done). A layer kept whole whose own temporaries and
saved tensors can outgrow its inputs and outputs otherwise (an LSTM's gates, a submodule
fx could not trace through) has no bound here. A graph
of module calls (the hooks capture: detectors, models fx and export cannot trace) shows
no op at all, but its capture ran the forward and counted every byte its ops allocated:
that total stands in for the nodes' outputs (Mask R-CNN's passes beside then start with
the graph, not 13 s later after the memory pass).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.nn.modules import activation, batchnorm, dropout, instancenorm, padding, pooling

from inspector.memory.optimizer import optimizer_state_bytes
from inspector.memory.step import unique_tensors

__all__ = ["StepBytes", "step_bytes"]


@dataclass(frozen=True)
class StepBytes:
    forward_peak: int  # an inference forward's peak
    saved: int  # what autograd saves for the backward
    train_peak: int  # a training step's peak


def step_bytes(ctx: Any) -> StepBytes | None:
    """The memory pass's estimate where it made one, else bounds from the graph pass's
    nodes; None where neither is known."""
    mem = ctx.report.memory
    estimated = (mem.forward_peak_bytes, mem.saved_activation_bytes, mem.train_peak_bytes)
    if all(n is not None for n in estimated):
        return StepBytes(*estimated)
    activations = _activation_bytes(ctx)
    if activations is None:
        return None
    totals = ctx.report.totals
    weights = totals.param_bytes + totals.buffer_bytes
    inputs = sum(t.numel() * t.element_size() for t in ctx.inputs.tensors())
    trainable = [p for p in unique_tensors(ctx.model.parameters()) if p.requires_grad]
    grads = sum(p.numel() * p.element_size() for p in trainable)
    state = sum(
        optimizer_state_bytes(trainable, ctx.options.optimizer, ctx.options.device).values()
    )
    saved = inputs + 3 * activations
    return StepBytes(
        forward_peak=weights + inputs + activations,
        saved=saved,
        train_peak=weights + grads + state + saved + activations + 2 * grads,
    )


def _activation_bytes(ctx: Any) -> int | None:
    """What a forward's ops output, all of it: the graph's nodes' outputs where the graph
    shows every op, else what a hooks capture's run allocated op by op (its graph shows
    module calls only; inspector/graph/allocated.py); None where neither is known."""
    capture, totals = ctx.capture, ctx.report.totals
    if ctx.report.nodes and totals.output_bytes:
        inside = _inside_bytes(capture, ctx.report.nodes)
        if inside is not None:
            return totals.output_bytes + inside  # the inputs' placeholders included
    if capture is not None and capture.method == "hooks" and not capture.eval_mode:
        return capture.allocated_bytes or None
    return None


# Layers kept whole whose temporaries and saved tensors are no larger than their inputs
# and outputs (a max pool's indices: twice its output, within the margin above).
_SHOWN_WHOLE = (
    nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd, batchnorm._BatchNorm, nn.LayerNorm,
    nn.GroupNorm, instancenorm._InstanceNorm, nn.Embedding, dropout._DropoutNd,
    pooling._MaxPoolNd, pooling._AvgPoolNd, pooling._AdaptiveAvgPoolNd,
    pooling._AdaptiveMaxPoolNd, nn.Upsample, nn.PixelShuffle, nn.PixelUnshuffle,
    nn.Flatten, nn.Unflatten, nn.Identity, padding._ConstantPadNd, padding._ReflectionPadNd,
    padding._ReplicationPadNd, activation.ReLU, activation.ReLU6, activation.LeakyReLU,
    activation.PReLU, activation.ELU, activation.SELU, activation.CELU, activation.GELU,
    activation.SiLU, activation.Mish, activation.Sigmoid, activation.Tanh,
    activation.Hardtanh, activation.Hardswish, activation.Hardsigmoid, activation.Softplus,
    activation.Softmax, activation.LogSoftmax,
)  # fmt: skip


def _inside_bytes(capture: Any, nodes: list[Any]) -> int | None:
    """What the layers the graph keeps whole output inside, on top of their outputs, at
    most: nothing where the graph has a node for every op or the layer is as small inside
    as outside; None where a layer's inside is not bounded."""
    if capture is None or capture.graph_module is None:
        return None
    if capture.method == "export":  # traced down to ATen ops
        return 0
    if capture.method != "fx" or capture.fx_leaves:  # a submodule kept whole after a failure
        return None
    gm, rows = capture.graph_module, {node.name: node for node in nodes}
    inside = 0
    for node in (n for n in gm.graph.nodes if n.op == "call_module"):
        module = gm.get_submodule(node.target)
        if isinstance(module, _SHOWN_WHOLE):
            continue
        row = rows.get(node.name)
        bound = None
        if isinstance(module, nn.MultiheadAttention) and row is not None:
            bound = _attention_bytes(module, row.input_tensors)
        if bound is None:
            return None
        inside += bound
    return inside


def _attention_bytes(module: nn.MultiheadAttention, inputs: list[Any]) -> int | None:
    """What an nn.MultiheadAttention call's ops output at most, its inputs given (query,
    key, value): the projections of all three and their copies split into heads, the
    scores of every head, their softmax, dropout's mask and output and the weights
    averaged over the heads (five times the scores), and the heads' output, its merged
    copy and the output projection (three times the query's size). In elements of the
    query's size, four bytes at least."""
    if len(inputs) < 3 or any(len(t.shape) not in (2, 3) for t in inputs[:3]):
        return None  # a key or value given by keyword: its size is not on the node
    query, key = inputs[0], inputs[1]
    if len(query.shape) != len(key.shape) or not query.shape[-1] or not key.shape[-1]:
        return None
    batch = 1
    if len(query.shape) == 3:
        batch = query.shape[0] if module.batch_first else query.shape[1]
    queries = math.prod(query.shape) // query.shape[-1]  # batch x target length
    keys = math.prod(key.shape) // key.shape[-1]  # batch x source length
    scores = module.num_heads * queries * (keys // max(batch, 1))
    projected = (queries + 2 * keys) * module.embed_dim
    item = max(query.bytes // max(math.prod(query.shape), 1), 4)
    return item * (2 * projected + 5 * scores + 3 * queries * module.embed_dim)
