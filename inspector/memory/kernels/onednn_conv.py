"""oneDNN's convolution on CPU (PyTorch's `Mkldnn` conv backend, float32, plain NCHW/NCDHW
tensors): the kernel works in blocked layouts (channels in blocks of 16 on AVX-512), so
it copies what it reads and writes into them and frees the copies before returning.

Measured with the CPU profiler on the small r3d_18, DeepLabV3 and ConvNeXt equivalents
(tests/kernel_models.py; tests/test_kernel_memory.py):
- a 1x1, stride-1, unpadded conv runs as a plain GEMM: no copies;
- forward: a first layer (input channels not a multiple of 16) reads its input as it is
  and writes a blocked copy of the output; any other layer copies its input and weights;
- backward: a first layer copies the output gradient; any other layer holds two blocked
  activation copies of the larger of the input and the output gradient at once.
A dilated conv padded wider than its kernel (ASPP's rates 12-36) takes another oneDNN
implementation with a larger scratchpad: the copies are counted and the call is reported
as not fully modelled. Transposed convs, other dtypes and other backends are not modelled.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from inspector.memory.kernels.registry import KernelMemory, formula

__all__ = ["conv_forward_scratch", "conv_backward_scratch"]

aten = torch.ops.aten
BLOCK = 16  # AVX-512 float32 channel block


def _blocked_bytes(shape: Any) -> int:
    """Bytes of an activation in the blocked layout: channels rounded up to the block."""
    channels = -(-int(shape[1]) // BLOCK) * BLOCK
    return math.prod(int(d) for d in shape) // int(shape[1]) * channels * 4


def _nbytes(shape: Any) -> int:
    return math.prod(int(d) for d in shape) * 4


def _pointwise(weight: torch.Tensor, stride: Any, padding: Any) -> bool:
    return (
        all(k == 1 for k in weight.shape[2:]) and all(s == 1 for s in stride) and not any(padding)
    )


def _first_layer(x: torch.Tensor) -> bool:
    return int(x.shape[1]) % BLOCK != 0


def _wide_dilation(weight: torch.Tensor, padding: Any, dilation: Any) -> bool:
    dims = zip(weight.shape[2:], padding, dilation, strict=False)
    return any(d > 1 and p > k - 1 for k, p, d in dims)


def conv_forward_scratch(x: torch.Tensor, weight: torch.Tensor, out_shape: Any) -> int:
    if _first_layer(x):
        return _blocked_bytes(out_shape)
    return _blocked_bytes(x.shape) + _nbytes(weight.shape)


def conv_backward_scratch(x: torch.Tensor, grad_out: torch.Tensor) -> int:
    if _first_layer(x):
        return _blocked_bytes(grad_out.shape)
    return 2 * max(_blocked_bytes(x.shape), _blocked_bytes(grad_out.shape))


def _onednn(x: torch.Tensor, weight: torch.Tensor, conv: tuple) -> bool:
    stride, padding, dilation, transposed, output_padding, groups = conv
    if x.device.type != "cpu" or x.dtype != torch.float32 or transposed:
        return False
    backend = torch._C._select_conv_backend(
        x, weight, None, stride, padding, dilation, transposed, output_padding, groups, None
    )
    return backend == torch._C._ConvBackend.Mkldnn


@formula(aten.convolution.default)
def _forward(args: tuple, kwargs: dict, out: Any) -> KernelMemory | None:
    x, weight, _, stride, padding, dilation, transposed, output_padding, groups = args
    if not _onednn(x, weight, (stride, padding, dilation, transposed, output_padding, groups)):
        return None
    if _pointwise(weight, stride, padding):
        return KernelMemory()
    scratch = conv_forward_scratch(x, weight, out.shape)
    return KernelMemory(scratch, partial=_wide_dilation(weight, padding, dilation))


@formula(aten.convolution_backward.default)
def _backward(args: tuple, kwargs: dict, out: Any) -> KernelMemory | None:
    grad_out, x, weight, _, stride, padding, dilation, transposed, output_padding, groups = args[
        :10
    ]
    if not _onednn(x, weight, (stride, padding, dilation, transposed, output_padding, groups)):
        return None
    if _pointwise(weight, stride, padding):
        return KernelMemory()
    scratch = conv_backward_scratch(x, grad_out)
    return KernelMemory(scratch, partial=_wide_dilation(weight, padding, dilation))
