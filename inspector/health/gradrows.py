"""Per-parameter and per-layer gradient rows with their verdicts."""

from __future__ import annotations

import math

import torch

from inspector.context import Context
from inspector.health.backprop import BackwardRun
from inspector.health.cutsite import cut_for, fx_cut_node
from inspector.report import LayerGrad, ParamGrad

__all__ = ["param_rows", "layer_rows", "owner", "module_grad_norms", "GATE_NAMES"]

# The names of parameters that scale a block's output: layer scales and norm gains.
GATE_NAMES = frozenset({"gamma", "weight", "scale", "gamma_1", "gamma_2", "layer_scale"})
GATE_RMS = 1e-3  # a gate this close to zero silences its block at initialisation


def owner(name: str) -> str:
    return name.rpartition(".")[0]


def _norm(t: torch.Tensor) -> float:
    return torch.linalg.vector_norm(t.detach().double()).item()


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
    gm = ctx.capture.graph_module if ctx.capture is not None else None
    node = fx_cut_node(gm, row.module_path)
    row.cut_at = cut.describe() + (f" (graph node `{node}`)" if node else "")


def _judge(rows: list[ParamGrad], th: dict[str, float]) -> None:
    """NaN/Inf is a parameter's own verdict; vanishing and exploding are its layer's
    (`layer_rows` hands them down), so the table and the findings say the same."""
    for row in rows:
        if row.verdict == "ok" and row.nan_count + row.inf_count:
            row.verdict = "nan"


def _verdict(norm: float, ratio: float | None, largest: float, th: dict) -> str:
    if norm > th["exploding_norm"] or (ratio is not None and ratio > th["exploding_ratio"]):
        return "exploding"
    if largest > 0 and norm <= th["vanishing_ratio"] * largest:
        return "vanishing"
    return "ok"


def layer_rows(
    ctx: Context, run: BackwardRun, params: list[ParamGrad], th: dict
) -> list[LayerGrad]:
    """Modules owning trainable parameters, in the order the forward first called them.
    Each parameter still "ok" takes its layer's verdict."""
    by_owner: dict[str, list[ParamGrad]] = {}
    for row in params:
        if row.verdict != "frozen":
            by_owner.setdefault(row.module_path, []).append(row)
    order = [p for p in run.called if p in by_owner] + [p for p in by_owner if p not in run.called]
    types = {p: type(m).__name__ for p, m in ctx.model.named_modules()}
    layers = [_layer(path, types.get(path, ""), i, by_owner[path]) for i, path in enumerate(order)]
    largest = max((x.grad_norm for x in layers if x.grad_norm is not None), default=0.0)
    gates = _gates(params)
    for layer in layers:
        if layer.verdict == "ok" and layer.grad_norm is not None:
            layer.verdict = _verdict(layer.grad_norm, layer.ratio, largest, th)
        if layer.verdict == "vanishing" and _gated(layer.module_path, gates):
            layer.verdict = "gated"
        for row in by_owner[layer.module_path]:
            if row.verdict == "ok":
                row.verdict = layer.verdict
    return layers


def _layer(path: str, type_name: str, index: int, rows: list[ParamGrad]) -> LayerGrad:
    """The layer's gradient norm over all its parameters; its grad/weight ratio over the
    matrices and kernels only: a bias, a norm's gain or a layer scale starts at or near
    zero, and a gradient "larger than the weight" says nothing there."""
    layer = LayerGrad(module_path=path, type=type_name, depth_index=index)
    with_grad = [r for r in rows if r.grad_norm is not None]
    if not with_grad:
        layer.verdict = rows[0].verdict  # unused / cut
        return layer
    layer.grad_norm = math.sqrt(sum(r.grad_norm**2 for r in with_grad))
    matrices = [r for r in with_grad if len(r.shape) >= 2]
    weight = math.sqrt(sum((r.weight_norm or 0.0) ** 2 for r in matrices))
    if matrices and weight:
        layer.ratio = math.sqrt(sum(r.grad_norm**2 for r in matrices)) / weight
    if any(r.verdict == "nan" for r in rows):
        layer.verdict = "nan"
    return layer


def _gates(params: list[ParamGrad]) -> list[str]:
    """Module paths holding a gate: a 1-D scale at (or within 1e-3 of) zero that receives a
    gradient: a layer scale (ConvNeXt, CaiT) or a zero-initialised residual norm."""
    gates = []
    for row in params:
        if len(row.shape) != 1 or not row.shape[0] or not row.grad_norm:
            continue
        rms = (row.weight_norm or 0.0) / math.sqrt(row.shape[0])
        if rms <= GATE_RMS and row.name.rpartition(".")[2] in GATE_NAMES:
            gates.append(row.module_path)
    return gates


def _gated(path: str, gates: list[str]) -> bool:
    """A layer in the block a gate scales: the gate's module (or its parent, for a gate in
    its own submodule such as `ls1.gamma` or `bn3.weight`) contains the layer."""
    for gate in gates:
        blocks = {gate, gate.rpartition(".")[0]} - {""}  # the root scales nothing by itself
        if path != gate and any(path == b or path.startswith(b + ".") for b in blocks):
            return True
    return False


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
