"""BatchNorm's backward on the CPU (`aten.native_batch_norm_backward`, which InstanceNorm
and functional batch norms also reach): when the input's gradient is asked for, the
kernel takes one input-sized buffer besides its outputs and frees it before returning.

Measured with the CPU profiler's allocation events (peak minus end inside the call): the
input's size exactly, in train and eval mode, NCHW and channels-last, float32 and
bfloat16, with and without affine parameters, at one and two threads, on 2-D to 4-D
inputs; nothing when only the parameters' gradients are asked for. It matters where a
BatchNorm's backward is near the step's peak: timm's NFNets standardise every conv weight
with `F.batch_norm` in forward, whose backward on the largest (1536 x 2304) weight took
14.2 MB that the estimate had not counted (eca_nfnet_l0: -3.3% against the allocator).
GroupNorm's and LayerNorm's backwards take a few hundred bytes to 2 KiB: not counted.
"""

from __future__ import annotations

from typing import Any

import torch

from inspector.memory.kernels.registry import KernelMemory, formula

__all__ = ["batch_norm_backward_scratch"]

aten = torch.ops.aten


def batch_norm_backward_scratch(x: torch.Tensor, input_grad: bool) -> int:
    return x.numel() * x.element_size() if input_grad else 0


@formula(aten.native_batch_norm_backward.default)
def _backward(args: tuple, kwargs: dict, out: Any) -> KernelMemory | None:
    grad_out, x = args[0], args[1]
    mask = args[9] if len(args) > 9 else kwargs.get("output_mask", (True, True, True))
    if x.device.type != "cpu" or grad_out.device.type != "cpu":
        return None  # another device's kernel (cuDNN's, MIOpen's): named, not counted
    return KernelMemory(batch_norm_backward_scratch(x, bool(mask[0])))
