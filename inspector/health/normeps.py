"""Norm layers whose eps is lost in the run's low-precision dtype.

A norm divides by sqrt(var + eps); eps is what keeps a zero-variance row (padding, a
constant channel, values that underflowed) finite. The criterion is numerical: float16
rounds any eps below 2**-25 (about 3.0e-8, half its smallest subnormal 6.0e-8) to exactly
0, so where var + eps is computed in float16 a zero variance gives 1/sqrt(0) = inf and
0 * inf = NaN. A subnormal eps (1e-5, 1e-6) stays nonzero and does its job; bfloat16 keeps
float32's exponent, so no practical eps is lost there.

Whether a layer adds its eps in the low dtype depends on the op, the device and the dtype
mode, not on the eps alone: under autocast nn.LayerNorm, nn.GroupNorm and nn.RMSNorm add
it in float32 (BERT's eps=1e-12 is safe), HF's RMSNorm upcasts its input itself, while a
Python LayerNorm/RMSNorm on a float16 input, and on CPU InstanceNorm (and BatchNorm in a
float16 model), add it in float16. So each layer whose eps would round to zero is run
once, in train mode, on a zero-variance input of the shape and dtype it received in a
forward under the same autocast: an inf/NaN output is the proof that its eps was lost.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from inspector.context import Context
from inspector.health.outputs import flat_tensors
from inspector.health.state import preserved, seeded

__all__ = ["LostEps", "lost_norm_eps", "compute_dtype", "rounds_to_zero", "LOW_DTYPES"]

LOW_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# The attribute names norm layers keep their eps under (torch, HF's RMSNorm, T5, others).
_EPS_NAMES = ("eps", "variance_epsilon", "epsilon")
_BUILTIN_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.modules.batchnorm._NormBase)


@dataclass
class LostEps:
    path: str  # module path
    type: str  # class name
    eps: float
    dtype: str  # the run's low dtype: "float16"
    input_dtype: str  # what the layer received in the forward


def compute_dtype(ctx: Context) -> torch.dtype | None:
    """The low dtype the run computes in: `--dtype`'s autocast dtype, else the weights'
    own (a model cast to float16 computes in float16 without autocast); None for float32."""
    if ctx.options.dtype in LOW_DTYPES:
        return LOW_DTYPES[ctx.options.dtype]
    floats = [p.dtype for p in ctx.model.parameters() if p.is_floating_point()]
    low = [d for d in floats if d in LOW_DTYPES.values()]
    return low[0] if floats and len(low) == len(floats) else None


def rounds_to_zero(eps: float, dtype: torch.dtype) -> bool:
    return eps > 0 and torch.tensor(eps, dtype=dtype).item() == 0.0


def lost_norm_eps(ctx: Context) -> list[LostEps]:
    """The norm layers whose eps the run's low dtype rounds to zero where they add it."""
    dtype = compute_dtype(ctx)
    if dtype is None:
        return []
    candidates = [(p, m, e) for p, m, e in _norms(ctx.model) if rounds_to_zero(e, dtype)]
    if not candidates:
        return []
    autocast = ctx.options.dtype in LOW_DTYPES
    with preserved(ctx.model):
        received = _received_inputs(ctx, [m for _, m, _ in candidates], dtype, autocast)
        return [
            LostEps(path, type(module).__name__, eps, _name(dtype), _name(received[id(module)][1]))
            for path, module, eps in candidates
            if id(module) in received and _loses_eps(ctx, module, received[id(module)], dtype)
        ]


def _norms(model: nn.Module) -> Iterator[tuple[str, nn.Module, float]]:
    """(path, module, eps) of torch's norm layers and of modules named *Norm* with an eps."""
    for path, module in model.named_modules():
        builtin = isinstance(module, _BUILTIN_NORMS)
        if not builtin and "norm" not in type(module).__name__.lower():
            continue
        eps = next((getattr(module, n) for n in _EPS_NAMES if hasattr(module, n)), None)
        if isinstance(eps, float | int) and not isinstance(eps, bool):
            yield path, module, float(eps)


def _received_inputs(
    ctx: Context, modules: list[nn.Module], dtype: torch.dtype, autocast: bool
) -> dict[int, tuple[torch.Size, torch.dtype]]:
    """(shape, dtype) of the first floating input each module got in one forward run the
    way the user's training would run it (under autocast when --dtype asks for it)."""
    seen: dict[int, tuple[torch.Size, torch.dtype]] = {}

    def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
        tensor = next((t for _, t in flat_tensors((args, kwargs)) if t.is_floating_point()), None)
        if tensor is not None:
            seen.setdefault(id(module), (tensor.shape, tensor.dtype))

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    try:
        with torch.no_grad(), _autocast(ctx, dtype, autocast):
            seeded(ctx.options.seed)
            ctx.inputs.call(ctx.model)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _loses_eps(
    ctx: Context, module: nn.Module, received: tuple[torch.Size, torch.dtype], dtype: torch.dtype
) -> bool:
    """Run the layer in train mode (batch statistics) on zeros: the variance is 0, so the
    output is finite exactly when eps survived."""
    shape, input_dtype = received
    zeros = torch.zeros(shape, dtype=input_dtype, device=ctx.options.device)
    autocast = _autocast(ctx, dtype, ctx.options.dtype in LOW_DTYPES)
    try:
        with preserved(module), torch.no_grad(), autocast:
            module.train()
            out = module(zeros)
    except Exception:  # noqa: BLE001 - a layer that needs more than its input: no verdict
        return False
    floats = [t for _, t in flat_tensors(out) if t.is_floating_point()]
    return any(not bool(torch.isfinite(t).all()) for t in floats)


def _autocast(ctx: Context, dtype: torch.dtype, enabled: bool) -> AbstractContextManager:
    return torch.autocast(ctx.options.device, dtype=dtype) if enabled else nullcontext()


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
