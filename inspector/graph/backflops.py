"""Backward FLOPs from the forward run: torch's own backward formulas, applied to each
counted forward op with the inputs that require grad.

Autograd only computes the gradient of an input that requires grad: `mm(a, b)` costs
one mm per such input, a convolution what `aten.convolution_backward`'s formula says for
its output mask, a fused attention the registered attention-backward formula. So one
forward run with grad enabled (fake or meta tensors: nothing is kept) gives the backward
FLOPs that a fake backward would measure, without running it. An op with FLOPs and no
rule here is reported as unknown: the caller then measures a fake backward instead.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, shape_wrapper

from inspector.dispatchmode import LeanDispatchMode
from inspector.graph.flops import EXTRA_FORMULAS

__all__ = [
    "TrainingFlopCounter", "attention_backward", "backward_flops", "fused_layout",
    "is_attention",
]  # fmt: skip

_aten = torch.ops.aten

# forward op -> positions of its two matrix operands (bias / input-to-add excluded)
_MATMULS = {_aten.mm: (0, 1), _aten.bmm: (0, 1), _aten.addmm: (1, 2), _aten.baddbmm: (1, 2)}
_CONVOLUTIONS = {_aten.convolution, _aten._convolution}
_FUSED_ATTENTION = {
    getattr(_aten, name)
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if hasattr(_aten, name)
}


def requires_grad(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad


def sdpa_backward(out: torch.Tensor, q: Any, k: Any, v: Any) -> int:
    """The fused attention backward (scores recomputed, then four matmuls)."""
    if not any(requires_grad(t) for t in (q, k, v)):
        return 0
    k_shape, v_shape = _heads_of(q.shape, k.shape), _heads_of(q.shape, v.shape)
    return sdpa_backward_flop_count(out.shape, q.shape, k_shape, v_shape)


def _heads_of(q: torch.Size, kv: torch.Size) -> tuple[int, ...]:
    """Grouped-query attention (fewer key/value heads) costs what attention with every
    query head does; torch before 2.13 asserts equal heads in its formula."""
    if len(q) == 4 and len(kv) == 4 and kv[1] != q[1] and kv[1] and q[1] % kv[1] == 0:
        return (kv[0], q[1], kv[2], kv[3])
    return tuple(kv)


def backward_flops(packet: Any, forward: int, out: Any, args: tuple, kwargs: dict) -> int | None:
    """Backward FLOPs of one forward op that counted `forward` FLOPs; None: no rule."""
    if packet in _MATMULS:
        i, j = _MATMULS[packet]
        return forward * (requires_grad(args[i]) + requires_grad(args[j]))
    if packet in _CONVOLUTIONS:
        x, w, bias = args[:3]
        mask = [requires_grad(x), requires_grad(w), requires_grad(bias)]
        if not any(mask):
            return 0
        stride, padding, dilation, transposed, output_padding, groups = args[3:9]
        formula = flop_registry[_aten.convolution_backward]
        return formula(
            out, x, w, None, stride, padding, dilation, transposed, output_padding, groups, mask,
            out_val=(x, w, None),
        )  # fmt: skip
    if packet in _FUSED_ATTENTION:
        return sdpa_backward(out[0], *args[:3])
    return None


class TrainingFlopCounter(LeanDispatchMode):
    """Counts forward FLOPs with torch's formulas (and ours for the CPU attention), and
    the backward FLOPs of every counted op; names the ops it has no backward rule for.

    Unlike FlopCounterMode it does not decompose uncounted ops to look inside them: with
    grad enabled, composite ops are already decomposed above this mode, and decomposing
    the rest (batch norm into a dozen elementwise refs) only costs time."""

    def __init__(self) -> None:
        super().__init__()
        extra = {op: f if getattr(f, "_get_raw", False) else shape_wrapper(f)
                 for op, f in EXTRA_FORMULAS.items()}  # fmt: skip
        self.formulas = {**flop_registry, **extra}
        self.forward_total = 0
        self.backward_total = 0
        self.unknown: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = getattr(func, "_overloadpacket", func)
        formula = self.formulas.get(packet)
        if formula is None:
            return out
        forward = formula(*args, **kwargs, out_val=out)
        self.forward_total += forward
        if forward:
            backward = backward_flops(packet, forward, out, args, kwargs)
            if backward is None:
                if any(requires_grad(a) for a in args):
                    self.unknown.add(str(packet))
            else:
                self.backward_total += backward
        return out


_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")


def is_attention(target: Any) -> bool:
    """An fx / export node target that is scaled_dot_product_attention."""
    return "scaled_dot_product_attention" in str(getattr(target, "__name__", target))


def attention_backward(device: torch.device, out: Any, args: tuple, kwargs: dict) -> int | None:
    """Backward FLOPs of one scaled_dot_product_attention call run on meta tensors, as
    the kernel torch picks on `device` counts them. Meta runs the math path (two matmuls,
    whose backward the counter already counted); a fused kernel's backward also
    recomputes the scores. None: the math path, keep what was counted."""
    bound = dict(zip(_SDPA_PARAMS, args, strict=False)) | kwargs
    q, k, v = bound["query"], bound["key"], bound["value"]
    if not isinstance(out, torch.Tensor) or not _fused_kernel(device, bound):
        return None
    return sdpa_backward(out, q, k, v)


def fused_layout(out: torch.Tensor) -> torch.Tensor:
    """A meta attention output [B, H, S, D] strided as the fused kernels (flash, memory
    efficient, CPU flash) lay theirs out: [B, S, H, D] in memory, so the usual
    `.transpose(1, 2).contiguous()` after it copies nothing there either."""
    if out.dim() != 4:
        return out
    b, h, s, d = out.shape
    return out.as_strided(out.shape, (s * h * d, d, h * d, 1))


def _fused_kernel(device: torch.device, bound: dict) -> bool:
    """Whether torch's kernel choice on `device` is a fused one. The choice depends on
    shapes, strides, dtypes and flags, not values, so it is asked with uninitialized
    tensors like the call's (fake ones would get the meta answer, the math path)."""
    try:
        probe = {n: _empty_like(bound.get(n), device) for n in ("query", "key", "value")}
        probe["attn_mask"] = _empty_like(bound.get("attn_mask"), device)
        choice = _aten._fused_sdp_choice(
            probe["query"], probe["key"], probe["value"], probe["attn_mask"],
            float(bound.get("dropout_p", 0.0)), bool(bound.get("is_causal", False)),
            scale=bound.get("scale"), enable_gqa=bool(bound.get("enable_gqa", False)),
        )  # fmt: skip
    except Exception:  # a device not here (CUDA on a CPU host): its usual fused kernel
        return True
    return int(choice) != 0  # 0: the math path


def _empty_like(t: Any, device: torch.device) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    empty = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
    return empty.requires_grad_(t.requires_grad) if t.requires_grad else empty
