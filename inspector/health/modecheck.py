"""Which modules behave differently in train() and eval(), and BatchNorm inputs."""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd
from torch.nn.modules.instancenorm import _InstanceNorm

from inspector.health.slices import SLICE
from inspector.memory.allocations import ours

__all__ = [
    "mode_dependent", "reads_training", "BatchNormInput", "batchnorm_probe", "channel_variance",
]  # fmt: skip


@functools.cache
def reads_training(cls: type) -> bool:
    """Does `cls.forward` (or a function nested in it) read `training`?"""
    code = getattr(getattr(cls, "forward", None), "__code__", None)
    stack = [code] if code is not None else []
    while stack:
        current = stack.pop()
        if "training" in current.co_names:
            return True
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return False


def _is_mode_dependent(module: nn.Module) -> bool:
    if isinstance(module, _BatchNorm | _DropoutNd):
        return True
    if isinstance(module, _InstanceNorm):
        return module.track_running_stats
    return reads_training(type(module))


def mode_dependent(model: nn.Module) -> list[str]:
    """Paths of modules whose forward depends on train/eval mode ("" is the root)."""
    return [path for path, module in model.named_modules() if _is_mode_dependent(module)]


@dataclass
class BatchNormInput:
    path: str
    type: str
    shape: list[int]
    values_per_channel: int  # batch x spatial: what the batch statistics are computed over
    # running stats still at their initial values (mean 0, var 1, no batch tracked)
    stats_at_defaults: bool | None = None
    batch_var_ratio: float | None = None  # max over channels: batch var / running var


def _running_stats(module: nn.Module, x: torch.Tensor, found: BatchNormInput) -> None:
    """How the running stats (what eval() normalises with) compare with this batch's."""
    mean, var = getattr(module, "running_mean", None), getattr(module, "running_var", None)
    if mean is None or var is None or x.is_meta or not x.is_floating_point():
        return
    with torch.no_grad():
        tracked = getattr(module, "num_batches_tracked", None)
        found.stats_at_defaults = bool(
            (mean == 0).all() and (var == 1).all() and (tracked is None or int(tracked) == 0)
        )
        if found.values_per_channel > 1:
            ratio = channel_variance(x.detach()) / var.double().clamp_min(1e-12)
            found.batch_var_ratio = float(ratio.max())


def channel_variance(x: torch.Tensor) -> torch.Tensor:
    """Each channel's (dim 1's) unbiased variance over the batch and the other dims, in
    float64: two passes over a few batch items at a time, through one buffer of their
    size. The whole tensor transposed and copied (`x.transpose(0, 1).reshape(C, -1)`),
    then `var`, cost 35 ms on a [8, 64, 112, 112] input, and a forward has a BatchNorm
    after every convolution."""
    n, c = x.shape[0], x.shape[1]
    rest = x.reshape(n, c, -1)  # a view where x is contiguous
    per = max(1, SLICE // max(c * rest.shape[2], 1))  # batch items per chunk
    chunks = [rest[i : i + per].float() for i in range(0, n, per)]
    count = rest.shape[0] * rest.shape[2]
    mean = sum(chunk.sum(dim=(0, 2)).double() for chunk in chunks) / count
    centre = mean.float().view(1, c, 1)
    buffer = torch.empty(chunks[0].numel(), dtype=torch.float32)
    squares = torch.zeros(c, dtype=torch.float64)
    for chunk in chunks:
        centred = torch.sub(chunk, centre, out=buffer[: chunk.numel()].view(chunk.shape))
        squares += centred.mul_(centred).sum(dim=(0, 2)).double()
    return squares / (count - 1)


def batchnorm_probe(model: nn.Module, seen: dict[str, BatchNormInput]) -> list:
    """Forward pre-hooks recording each BatchNorm's first input; returns the handles."""

    def hook_for(path: str):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple) -> None:
            x = args[0] if args else None
            if path in seen or x is None or x.dim() < 2:
                return
            values = x.numel() // max(x.shape[1], 1)
            found = BatchNormInput(path, type(module).__name__, list(x.shape), values)
            # unseen by a function mode watching the forward (the gradients pass's recorder)
            # and left out of a recorded step (inspector/memory/merged.py)
            with torch._C.DisableTorchFunction(), ours():
                _running_stats(module, x, found)
            seen[path] = found

        return hook

    return [
        m.register_forward_pre_hook(hook_for(p))
        for p, m in model.named_modules()
        if isinstance(m, _BatchNorm)
    ]
