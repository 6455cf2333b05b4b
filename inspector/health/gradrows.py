"""Per-parameter and per-layer gradient rows with their verdicts."""

from __future__ import annotations

import math

import torch

from inspector.context import Context
from inspector.health.backprop import BackwardRun
from inspector.health.cutsite import cut_for, fx_cut_node
from inspector.health.gates import gate_rows, is_vector, opened_grad_norms
from inspector.health.stats import float64_norm
from inspector.report import LayerGrad, ParamGrad

__all__ = ["param_rows", "layer_rows", "owner", "module_grad_norms"]


def owner(name: str) -> str:
    return name.rpartition(".")[0]


def _norm(t: torch.Tensor) -> float:
    return float64_norm(t)


def param_rows(ctx: Context, run: BackwardRun, th: dict[str, float]) -> list[ParamGrad]:
    rows = []
    for name, param in ctx.model.named_parameters():
        row = ParamGrad(
            name=name, module_path=owner(name), shape=list(param.shape), weight_norm=_norm(param)
        )
        if not param.requires_grad:
            row.verdict = "frozen"
        elif name in run.grads:
            stats = run.grads[name]
            row.grad_norm, row.zero_fraction = stats.norm, stats.zero_fraction
            row.nan_count, row.inf_count = stats.nan_count, stats.inf_count
            row.ratio = row.grad_norm / row.weight_norm if row.weight_norm else None
        else:
            _missing(ctx, run, row)
        rows.append(row)
    _judge(rows, th)
    return rows


def _missing(ctx: Context, run: BackwardRun, row: ParamGrad) -> None:
    """A trainable parameter whose grad stayed None: cut (it fed an op that leaves
    autograd) or unused (its module never ran, or its result never reached the loss)."""
    cut = cut_for(row.name, run.cuts)
    if cut is None:
        row.verdict = "unused"
        return
    row.verdict = "cut"
    gm = ctx.capture.graph_module if ctx.capture is not None and not cut.in_loss else None
    node = fx_cut_node(gm, row.module_path)  # the graph holds the forward, not loss_fn
    row.cut_at = cut.describe() + (f" (graph node `{node}`)" if node else "")


def _judge(rows: list[ParamGrad], th: dict[str, float]) -> None:
    """NaN/Inf is a parameter's own verdict; vanishing and exploding are its layer's
    (`layer_rows` hands them down), so the table and the findings say the same."""
    for row in rows:
        if row.verdict == "ok" and row.nan_count + row.inf_count:
            row.verdict = "nan"


def _verdict(
    layer: LayerGrad, largest_rms: float, later_rms: float, scale_free: bool, th: dict
) -> str:
    """Vanishing by the layer's gradient per element (RMS) against the largest layer's: a
    4x4 talking-heads matrix has 1/10,000 the entries of a classifier head, and comparing
    total norms called it vanishing for its size alone. Exploding: see `_exploding`."""
    if _exploding(layer, later_rms, scale_free, th):
        return "exploding"
    rms = layer.grad_rms or 0.0
    if largest_rms > 0 and rms <= th["vanishing_ratio"] * largest_rms:
        return "vanishing"
    return "ok"


def _exploding(layer: LayerGrad, later_rms: float, scale_free: bool, th: dict) -> bool:
    """A norm past `exploding_norm` (a loss or scale off by orders of magnitude), or a
    gradient that grew on its way back: per element `exploding_growth` x larger than any
    layer's between it and the loss, and larger than its weight x `exploding_ratio` (one
    SGD step at lr 0.1 would move the weight by more than its own size).

    The ratio alone is no sign of explosion at initialisation: a lookup table starts at std
    0.02 and its rows sum the gradients of every position that reads them (ALBERT's token
    types: every token reads row 0, grad/weight 15), and a first conv on raw pixels before
    a BatchNorm gets the largest gradient of a ResNet (FCN-ResNet50: 59), yet per element
    both are within 10x of the layers after them: nothing was amplified.

    Neither test says anything of a scale-free layer (one feeding a normalisation,
    inspector.health.scalefree): its gradient is its input's scale over its own norm, and
    a small weight makes it large by norm and by growth alike. A loss or a backward off
    by orders of magnitude still shows in the normalisation's own gain and in the layers
    after it."""
    if scale_free:
        return False
    norm, ratio, rms = layer.grad_norm or 0.0, layer.ratio, layer.grad_rms or 0.0
    if norm > th["exploding_norm"]:
        return True
    grown = later_rms > 0 and rms > th["exploding_growth"] * later_rms
    return grown and ratio is not None and ratio > th["exploding_ratio"]


def _later_rms(layers: list[LayerGrad]) -> dict[str, float]:
    """For each layer, the largest gradient RMS of the layers the forward ran after it
    (those nearer the loss); 0 for the last one."""
    out: dict[str, float] = {}
    running = 0.0
    for layer in sorted(layers, key=lambda x: x.depth_index, reverse=True):
        out[layer.module_path] = running
        running = max(running, layer.grad_rms or 0.0)
    return out


def layer_rows(
    ctx: Context, run: BackwardRun, params: list[ParamGrad], th: dict
) -> list[LayerGrad]:
    """Modules owning trainable parameters, in the order the forward first used their
    parameters (`_depth_order`). Each parameter still "ok" takes its layer's verdict."""
    by_owner: dict[str, list[ParamGrad]] = {}
    for row in params:
        if row.verdict != "frozen":
            by_owner.setdefault(row.module_path, []).append(row)
    order = _depth_order(run, by_owner)
    types = {p: type(m).__name__ for p, m in ctx.model.named_modules()}
    layers = [_layer(path, types.get(path, ""), i, by_owner[path]) for i, path in enumerate(order)]
    largest = max((x.grad_rms for x in layers if x.grad_rms is not None), default=0.0)
    later = _later_rms(layers)
    for layer in layers:
        if layer.verdict == "ok" and layer.grad_norm is not None:
            path = layer.module_path
            layer.verdict = _verdict(layer, largest, later[path], path in run.scale_free, th)
    _mark_gated(ctx, layers, by_owner, params, th)  # a gate explains it: "gated"
    _local_not_vanishing(layers)
    for layer in layers:
        for row in by_owner[layer.module_path]:
            if row.verdict == "ok":
                row.verdict = layer.verdict
    return layers


def _depth_order(run: BackwardRun, by_owner: dict[str, list[ParamGrad]]) -> list[str]:
    """Owners by the first op that read one of their parameters, then the rest by the
    first call of their forward. A container's own parameter is read where its forward
    uses it, not when the forward starts: torchvision SSD's L2 scale (`backbone`) is read
    after the tenth conv, and ordered first it was the one "vanishing" layer when the
    loss picked no anchor of the map it scales (its gradient, and the first head's, is
    exactly 0 on such a sample, while every conv before it has a healthy one)."""
    used = {name: i for i, name in enumerate(run.used)}
    called = {path: i for i, path in enumerate(run.called)}
    never = len(used) + len(called)

    def key(path: str) -> tuple[int, int]:
        first = min((used.get(r.name, never) for r in by_owner[path]), default=never)
        return first, called.get(path, never)

    return sorted(by_owner, key=key)


def _local_not_vanishing(layers: list[LayerGrad]) -> None:
    """Vanishing is about depth: the gradient dies on its way back, so the layers it fails
    to reach are the earliest ones. A small gradient in a layer while a layer the forward
    ran before it gets a healthy one is local to that layer, e.g. attention's query and key
    projections at initialisation (the gradient of a bilinear q.k is the product of two
    small factors while the logits are near 0; BERT: 4e-6 x the largest layer's)."""
    reached = False
    for layer in sorted(layers, key=lambda x: x.depth_index):
        if layer.verdict == "vanishing" and reached:
            layer.verdict = "ok"
        elif layer.verdict in ("ok", "exploding") and layer.grad_norm:
            reached = True


def _mark_gated(
    ctx: Context,
    layers: list[LayerGrad],
    by_owner: dict[str, list[ParamGrad]],
    params: list[ParamGrad],
    th: dict,
) -> None:
    """Vanishing layers that get their gradient back when the closed gates are opened
    (inspector.health.gates) are "gated": silenced at initialisation by design. Back means
    above the vanishing line of the opened run, or, for a gradient that was exactly zero,
    any gradient at all: the gate alone made it zero (LeViT's attention biases in its last
    blocks start at 0 and learn slowly, which is not what the model is warned about)."""
    vanishing = [x for x in layers if x.verdict == "vanishing"]
    gates = gate_rows(params) if vanishing else []
    if not gates:
        return
    opened = opened_grad_norms(ctx, gates)
    rms = {path: _group_rms(rows, opened) for path, rows in by_owner.items()}
    line = th["vanishing_ratio"] * max(rms.values(), default=0.0)
    for layer in vanishing:
        now = rms[layer.module_path]
        if now > line or (now > 0 and not layer.grad_norm):
            layer.verdict = "gated"


def _elements(rows: list[ParamGrad]) -> int:
    return sum(math.prod(r.shape) for r in rows)


def _group_rms(rows: list[ParamGrad], norms: dict[str, float]) -> float:
    total = sum(norms.get(r.name, 0.0) ** 2 for r in rows)
    return math.sqrt(total / max(_elements(rows), 1))


def _layer(path: str, type_name: str, index: int, rows: list[ParamGrad]) -> LayerGrad:
    """The layer's gradient norm over all its parameters; its grad/weight ratio over the
    matrices and kernels only: a bias, a norm's gain or a layer scale starts at or near
    zero, and a gradient "larger than the weight" says nothing there. A vector is a shape
    with one dimension above 1: torchvision ConvNeXt's (C, 1, 1) layer scale at 1e-6 made
    its 18 blocks "exploding" (grad/weight 50..280) when it counted as a kernel."""
    layer = LayerGrad(module_path=path, type=type_name, depth_index=index)
    with_grad = [r for r in rows if r.grad_norm is not None]
    if not with_grad:
        layer.verdict = rows[0].verdict  # unused / cut
        return layer
    layer.grad_norm = math.sqrt(sum(r.grad_norm**2 for r in with_grad))
    layer.grad_rms = layer.grad_norm / math.sqrt(max(_elements(with_grad), 1))
    matrices = [r for r in with_grad if not is_vector(r.shape)]
    weight = math.sqrt(sum((r.weight_norm or 0.0) ** 2 for r in matrices))
    if matrices and weight:
        layer.ratio = math.sqrt(sum(r.grad_norm**2 for r in matrices)) / weight
    if any(r.verdict == "nan" for r in rows):
        layer.verdict = "nan"
    return layer


def module_grad_norms(params: list[ParamGrad]) -> dict[str, float]:
    """Norm of the gradients of every parameter under each module path (tied once)."""
    sums: dict[str, float] = {}
    for row in params:
        if row.grad_norm is None:
            continue
        parts = row.name.split(".")[:-1]
        for depth in range(len(parts) + 1):
            path = ".".join(parts[:depth])
            sums[path] = sums.get(path, 0.0) + row.grad_norm**2
    return {path: math.sqrt(total) for path, total in sums.items()}
