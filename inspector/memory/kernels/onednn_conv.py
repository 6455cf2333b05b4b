"""oneDNN's convolution on CPU (PyTorch's `Mkldnn` conv backend, float32, contiguous
NCHW/NCDHW tensors). The kernel works in blocked layouts (channels in blocks of 16 on
AVX-512), so ideep copies what it reads and writes into them and frees the copies before
returning; the order of those copies, read off the CPU profiler's allocation events, is
what the peak inside the call depends on:

- forward: input copy S, weight copy W, output copy D; then the plain output, with D
  still live. A first layer (fewer than 16 input channels, oneDNN's "1st conv") reads
  its input as it is (no S). A strided 1x1 conv first gathers its strided input into a
  scratchpad (oneDNN's "reduce to unit stride": input channels x output pixels).
- backward, data: D (the output gradient), W, the input-gradient copy S; then the plain
  input gradient with S live (and one more S-sized copy for a strided conv).
- backward, weights (the input gradient kept): S, D, a weight-gradient copy and a
  bias-gradient copy; the plain weight gradient is read out of its copy while both live
  (on a small map, as a 960 -> 256 conv on 8 x 8, that moment is the call's peak).
- an output gradient that is not contiguous (the backward of `.sum()`) is copied first
  and held throughout.
A 1x1, stride-1, unpadded conv runs as a plain GEMM, with no copies.
A 3-D conv's backward weights at batch >= 2 and input depth <= 2 (r3d_18's layers 2-4 at 4
frames) runs oneDNN's GEMM kernel: 4 weight-sized partial gradients and an im2col column of
one output depth slice, byte-exact on 4 shapes (r3d_18: -2.7% -> 0.0%); at batch 1 another
GEMM kernel runs (a whole im2col), not modelled, so the call is reported. A 2-D conv
whose dilated kernel is wider than its map (DeepLabV3's ASPP at rates 12-36 on 4 x 4 or
8 x 8) runs the same GEMM backward weights over one image's column; on maps under 32 px a
dilated conv's backward may take other buffers, so those calls are reported.

Channels-last (NHWC) tensors, as ConvNeXt's permutes leave them, are read and written in
place; only the weights are copied: forward two weight copies and a scratchpad (a
depthwise conv: one copy); backward data a weight copy (input channels padded) and a
scratchpad; backward weights three weight-sized buffers besides the gradients. A
depthwise conv's weight gradient takes one of two kernels (`_nhwc_depthwise_backward`):
a direct one up to 3 x 3, or one with a per-channel reduction buffer of 256 x kernel
floats (CoaT's 5 x 5 and 7 x 7 position encodings: 5.9 MB for a 2 x 2 map).
The format is the one PyTorch hands oneDNN (channels-last when the input's or the
weight's strides suggest it); an input that is not dense in it (CoaT's channel slices of
its qkv) is copied dense first, and the copy lives through the call. A bias whose
channels are not a multiple of the block is copied padded. Depthwise convs on NCHW
tensors: the backward of a 3 x 3 holds the blocked input and output gradient; larger
kernels on large enough maps are modelled, the rest reported.

Measured on 23 single convs at one thread (`bench/memory.py kernel-shapes`): 18 byte-exact,
one 256 B under (a padded bias copy), three the unmodelled cases below, and a 3D first
layer whose input requires grad 4% under in backward; the small r3d_18, DeepLabV3 and
ConvNeXt nets byte-exact (the channels-last scratchpad sizes are the ones measured here).
A grid of 480 NCHW 3x3 calls (`bench/memory.py kernel-grid`: batch 1-4, 64-960 input
channels, 4-32 px, dilation 1-36, forward and backward): 297 byte-exact, 183 reported,
none counted short. A grid of 576 depthwise convs, 1,152 calls
(`bench/memory.py kernel-depthwise`: 3 x 3 to 7 x 7, 2-16 px, 16-96 channels, stride 1-2,
with and without bias, NHWC and NCHW, dense and channel slices, forward and backward):
none counted short. Not modelled, so the
call is reported: a strided channels-last backward (its scratchpad), the forward at a
dilation of 8 or more or of a kernel wider than its map (oneDNN's GEMM forward: an im2col
column blocked by a cache heuristic), the backward at a dilation of 8 or more (the same
heuristic may pick the GEMM backward), backward with more than one thread (per-thread
weight-gradient reduction buffers), groups narrower than the channel block (ResNeXt,
RegNet). Counted as 0: the small scratchpads of strided backward-data kernels on NCHW
tensors. Not counted at all, and reported: transposed convs, 3D channels-last tensors,
other dtypes, other backends and CPUs without AVX-512 (other channel blocks).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from inspector.memory.kernels.registry import (
    KernelMemory,
    formula,
    measured_here,
    on_avx2,
    simd_floats,
)

__all__ = [
    "conv_forward_scratch",
    "conv_backward_scratch",
    "conv3d_gemm_weights_scratch",
    "conv2d_gemm_weights_scratch",
]

aten = torch.ops.aten
F32 = 4
SCRATCHPAD_ALIGN = 128  # what a oneDNN scratchpad adds to its content, measured
GEMM_DILATION = 8  # from this dilation oneDNN may pick its GEMM conv (measured at batch 2)
DILATED_EXACT_FROM = 32  # px: a dilated conv's backward on smaller maps is not all modelled
# channels-last kernels' scratchpads at one thread, measured: forward, backward data
NHWC_FORWARD_SCRATCH, NHWC_BACKWARD_SCRATCH = 8216, 8344
# 3-D backward weights, batch >= 2, input depth <= 2: oneDNN's GEMM kernel (measured)
GEMM_3D_MAX_DEPTH, GEMM_3D_WEIGHT_COPIES, GEMM_3D_ALIGN = 2, 4, 256


def block() -> int:
    """The float32 channel block: 16 on AVX-512, 8 on AVX2. oneDNN's "1st conv" kernels
    take a layer with fewer input channels than this, and read its input as it is."""
    return simd_floats() or 16


def _pad(n: int) -> int:
    b = block()
    return -(-int(n) // b) * b


def _nbytes(shape: Any) -> int:
    return math.prod(int(d) for d in shape) * F32


def _blocked(shape: Any) -> int:
    """An activation in the blocked layout: channels rounded up to the block."""
    return _nbytes(shape) // int(shape[1]) * _pad(shape[1])


def _weights(weight: torch.Tensor, groups: int, first: bool) -> int:
    """The weight copy: per group, output and input channels rounded up to the block (the
    input channels of a first layer are not); depthwise weights are blocked by group."""
    oc, icg, kernel = int(weight.shape[0]), int(weight.shape[1]), math.prod(weight.shape[2:])
    if groups > 1 and icg == 1 and oc == groups:
        return _pad(groups) * kernel * F32
    ic = icg if first else _pad(icg)
    return groups * _pad(oc // groups) * ic * kernel * F32


def _first(x: torch.Tensor, groups: int) -> bool:
    return int(x.shape[1]) < block() and groups == 1


def _unit_stride(x: torch.Tensor, weight: torch.Tensor, out_shape: Any, stride: Any) -> int:
    """A strided 1x1 conv's scratchpad: its input gathered at the output's pixels."""
    if any(k != 1 for k in weight.shape[2:]) or all(s == 1 for s in stride):
        return 0
    return _pad(x.shape[1]) * math.prod(int(d) for d in out_shape[2:]) * F32 + SCRATCHPAD_ALIGN


def conv_forward_scratch(
    x: torch.Tensor, weight: torch.Tensor, out_shape: Any, groups: int, stride: Any
) -> int:
    first = _first(x, groups)
    s = 0 if first else _blocked(x.shape)
    w, d, out = _weights(weight, groups, first), _blocked(out_shape), _nbytes(out_shape)
    gather = _unit_stride(x, weight, out_shape, stride)
    return max(gather + s + w + d, d + out) - out


def conv_backward_scratch(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, groups: int,
    strided: bool, mask: Any,
) -> int:  # fmt: skip
    first = _first(x, groups)
    s, d, oc = _blocked(x.shape), _blocked(grad_out.shape), int(weight.shape[0])
    grad_in = _nbytes(x.shape) if mask[0] else 0
    data = weights = 0
    if mask[0]:
        data = max(d + _weights(weight, groups, False) + s, s + grad_in + (s if strided else 0))
    if mask[1]:
        depthwise = groups > 1 and int(weight.shape[1]) == 1
        reads = 0 if depthwise else d + (0 if first else s)
        weights = grad_in + reads + _weights(weight, groups, first) + _pad(oc) * F32 * mask[2]
    end = grad_in + _nbytes(weight.shape) * mask[1] + oc * F32 * mask[2]
    if mask[1]:  # the blocked weight gradient is read out into the plain one: both live
        weights = max(weights, end + _weights(weight, groups, first))
    copied = 0 if grad_out.is_contiguous() else _nbytes(grad_out.shape)
    # a depthwise conv's bias gradient takes no more (measured on 5x5 and 7x7, 24 channels)
    padded_bias = bool(mask[2]) and oc % block() != 0 and not _depthwise(weight, groups)
    return copied + max(0, max(data, weights) - end) + _bias_scratch(oc, padded_bias)


def _bias_scratch(oc: int, bias: bool) -> int:
    """A bias of output channels not a multiple of the block is copied padded into a
    scratchpad (forward: byte-exact on 4 shapes); backward its gradient's buffers take
    96-288 B more than the formula above: this bound, up to 160 B over. (On a map of 8 px
    a bias of 64 channels takes 256 B more too, not counted.)"""
    return _pad(oc) * F32 + SCRATCHPAD_ALIGN if bias else 0


def conv3d_gemm_weights_scratch(x: torch.Tensor, weight: torch.Tensor, grad_out: Any) -> int:
    """oneDNN's GEMM backward-weights kernel for a 3-D conv at batch >= 2 and input depth
    <= 2 (r3d_18's layers 2-4 at 4 frames): one scratchpad of 4 weight-sized partial
    gradients and an im2col column of one output depth slice (input channels x kernel x
    output H x W), whatever the input gradient. Byte-exact on 5 shapes at one thread
    (bench/conv3d_scratch.py, ZOO_FINDINGS.md); at depth 3 and more the direct kernel runs."""
    return _gemm_weights(x, weight, grad_out.shape[3:])


def conv2d_gemm_weights_scratch(x: torch.Tensor, weight: torch.Tensor, grad_out: Any) -> int:
    """The same GEMM kernel for a 2-D conv whose dilated kernel is wider than its input
    (DeepLabV3's ASPP at rates 12-36 on a 4x4 or 8x8 map; oneDNN's direct kernel does not
    take it): 4 weight-sized partial gradients and the im2col column of one image (input
    channels x kernel x output H x W). Byte-exact at one thread on 84 shapes (batch 1-4,
    64 and 256 input channels, 4-32 px, dilations 2-36): DeepLabV3-MobileNet's ASPP convs
    take 35.9 MB there, which the direct-kernel formula put at 0.16 MB."""
    return _gemm_weights(x, weight, grad_out.shape[2:])


def _gemm_weights(x: torch.Tensor, weight: torch.Tensor, column_pixels: Any) -> int:
    column = int(x.shape[1]) * math.prod(weight.shape[2:]) * math.prod(column_pixels)
    return GEMM_3D_WEIGHT_COPIES * _nbytes(weight.shape) + column * F32 + GEMM_3D_ALIGN


def _wider_than_input(x: torch.Tensor, weight: torch.Tensor, dilation: Any) -> bool:
    """Some dilated kernel extent, (k - 1) * d + 1 with d > 1, exceeds the input's size
    there (an undilated 3x3 on ResNet-18's 2x2 layer4 map runs the direct kernel)."""
    dims = zip(weight.shape[2:], dilation, x.shape[2:], strict=False)
    return any(int(d) > 1 and (int(k) - 1) * int(d) + 1 > int(size) for k, d, size in dims)


def _gemm_backward_weights(x: torch.Tensor, weight: torch.Tensor, dilation: Any) -> bool:
    """A 2-D conv's weight gradient by oneDNN's GEMM kernel: a dilated kernel wider than its
    map, and on AVX2 an undilated one too (a 3 x 3 on a 2 x 2 map: byte-exact on 6 calls
    of `bench/memory.py kernel-grid`, 64-960 channels, where the direct formula was 4x
    short)."""
    if _wider_than_input(x, weight, dilation):
        return True
    dims = zip(weight.shape[2:], x.shape[2:], strict=False)
    return on_avx2() and any(int(k) > int(size) for k, size in dims)


def _dilated(dilation: Any) -> bool:
    return any(int(d) > 1 for d in dilation)


def _conv3d_path(x: torch.Tensor, groups: int, mask: Any) -> str | None:
    """ "gemm" (modelled), "other" (a 3-D call no formula here knows) or None (not 3-D)."""
    if x.dim() != 5 or not mask[1]:
        return None
    batch, depth = int(x.shape[0]), int(x.shape[2])
    if batch >= 2 and depth > GEMM_3D_MAX_DEPTH:
        return None  # the direct kernel, modelled as the 2-D ones
    if batch >= 2 and groups == 1 and not mask[2]:
        return "gemm"
    return "other"  # batch 1 (a whole im2col), groups or a bias gradient: not measured


def _depthwise(weight: torch.Tensor, groups: int) -> bool:
    return groups > 1 and int(weight.shape[1]) == 1 and int(weight.shape[0]) == groups


def _grouped(weight: torch.Tensor, groups: int) -> bool:
    """Groups narrower than the channel block (ResNeXt's 4 channels, RegNet's 8 and 24):
    other kernels, not measured (the formulas here put a 32 -> 24 conv in 8 groups at 8x
    its forward scratch); groups of whole blocks (64 -> 128 in 2) are byte-exact."""
    if groups == 1 or _depthwise(weight, groups):
        return False
    b = block()
    return int(weight.shape[1]) % b != 0 or (int(weight.shape[0]) // groups) % b != 0


def nhwc_forward_scratch(weight: torch.Tensor, groups: int) -> int:
    """A depthwise conv's one weight copy is blocked by group, its channels padded to the
    block (timm CoaT's 24- and 120-channel position encodings: 32 and 128)."""
    if _depthwise(weight, groups):
        return _weights(weight, groups, False)
    return 2 * _nbytes(weight.shape) + NHWC_FORWARD_SCRATCH


def nhwc_backward_scratch(
    x: torch.Tensor, weight: torch.Tensor, groups: int, mask: Any, padding: Any, dilation: Any
) -> tuple[int, bool]:
    """(bytes on top of the call's outputs, whether measured exact)."""
    w, oc = _nbytes(weight.shape), int(weight.shape[0])
    if _depthwise(weight, groups):
        return _nhwc_depthwise_backward(x, weight, mask, padding, dilation)
    grad_in = _nbytes(x.shape) if mask[0] else 0
    bias = oc * F32 * mask[2]
    end = grad_in + w * mask[1] + bias
    data = grad_in + _weights(weight, groups, False) + NHWC_BACKWARD_SCRATCH if mask[0] else 0
    first = _first(x, groups)
    weights = grad_in + 3 * w + _weights(weight, groups, first) + 2 * bias
    data += w  # the forward-layout weight copy is held through the call
    return max(0, max(data, weights * mask[1]) - end), True


def _nhwc_depthwise_backward(
    x: torch.Tensor, weight: torch.Tensor, mask: Any, padding: Any, dilation: Any
) -> tuple[int, bool]:
    """Two oneDNN kernels compute a channels-last depthwise conv's weight gradient (read
    off the profiler, `bench/memory.py kernel-depthwise`): a direct one for
    kernels up to 3 x 3, undilated, padded by at most 1, on maps at least the kernel's
    height (a padded weight-gradient copy, a plain one and the bias gradient's); and one
    with a per-channel reduction buffer of 256 (AVX2: 64) x kernel floats otherwise (timm CoaT's
    5 x 5 and 7 x 7 position encodings, a 3 x 3 on a 2-px map). A bias gradient alone
    runs the same kernel; the input gradient alone takes only a padded weight copy."""
    w, oc = _nbytes(weight.shape), int(weight.shape[0])
    w_pad, bias = _weights(weight, oc, False), oc * F32 * mask[2]
    if not (mask[1] or mask[2]):
        return w_pad, True
    kernel, size = [int(k) for k in weight.shape[2:]], [int(n) for n in x.shape[2:]]
    small = max(kernel) <= 3 and not _dilated(dilation)
    if small and max(int(p) for p in padding) <= 1 and size[0] >= kernel[0]:
        return w_pad + w + bias, True
    # rows of the reduction buffer: block squared (measured: 256 on AVX-512, 64 on AVX2)
    reduce = oc * math.prod(kernel) * block() ** 2 * F32
    partial_sums = (oc + 2) * block() * F32
    # the weight gradient is returned or not, the scratch is the same (measured)
    scratch = reduce + max(partial_sums + bias, 2 * bias + 2 * w) - w - bias
    # a 3 x 3 padded by 2 takes a third kernel: not measured; on AVX2 so does a map
    # smaller than the kernel (no reduction buffer: a 7 x 7 on 4 px takes 1/13 of this)
    tiny = on_avx2() and any(n < k for n, k in zip(size, kernel, strict=False))
    return scratch, not (small or tiny)


def nchw_depthwise_backward_scratch(
    x: torch.Tensor, weight: torch.Tensor, grad_out: torch.Tensor, stride: Any,
    dilation: Any, mask: Any,
) -> tuple[int, bool]:  # fmt: skip
    """A depthwise conv on NCHW tensors, backward (`bench/memory.py kernel-depthwise`):
    a 3 x 3, undilated, on maps of 3 px and more holds the blocked input and output
    gradient besides the weights' copies (stride 1 or 2); a larger kernel on a map of at
    least 2k - 2 px with more than one channel block holds the blocked input (less the
    weight gradient when strided). Other calls (a kernel wider than its map, one channel
    block under a 5 x 5 or 7 x 7, dilation, smaller maps) take other kernels: the
    direct-kernel formula, reported as partial."""
    s, d = _blocked(x.shape), _blocked(grad_out.shape)
    w, oc = _nbytes(weight.shape), int(weight.shape[0])
    w_pad, bias = _weights(weight, oc, False), oc * F32 * mask[2]
    kernel, size = [int(k) for k in weight.shape[2:]], [int(n) for n in x.shape[2:]]
    measured = bool(mask[0] and mask[1]) and not _dilated(dilation)
    copied = 0 if grad_out.is_contiguous() else _nbytes(grad_out.shape)
    if max(kernel) == 3 and min(size) >= 3:
        return copied + s + d + w_pad - w, measured
    strided = any(int(n) > 1 for n in stride)
    generic = conv_backward_scratch(grad_out, x, weight, oc, strided, mask)  # copy included
    out = [int(n) for n in grad_out.shape[2:]]  # a strided call's output too
    maps = zip(size, out, kernel, strict=True)
    wide = int(x.shape[1]) > block() and all(min(n, o) >= 2 * k - 2 for n, o, k in maps)
    if not wide:
        return generic, False
    # on AVX2 a 5 x 5 or 7 x 7 on fewer than 8 blocks of channels may take other buffers
    # (16-48 channels: up to 2x this); exact from 64 (64-120 channels on 8 and 16 px)
    measured = measured and not (on_avx2() and int(x.shape[1]) < 8 * block())
    if strided:
        return copied + max(0, s - w - bias), measured
    return generic, measured


def _layout(x: torch.Tensor, weight: torch.Tensor | None = None) -> str | None:
    """ "nchw", "nhwc" (2D channels-last) or None (3D channels-last): the format PyTorch
    hands oneDNN, channels-last when the input's or the weight's strides suggest it
    (`mkldnn_conv_use_channels_last`), dense or not (see `_dense_copy`)."""
    if x.dim() == 5:
        return None if _channels_last_like(x) else "nchw"
    if _channels_last_like(x) or (weight is not None and _channels_last_like(weight)):
        return "nhwc"
    return "nchw"


def _channels_last_like(t: torch.Tensor) -> bool:
    """c10's `is_channels_last_strides_2d/3d`, which `suggest_memory_format()` reads:
    strides increasing through C, then the spatial dims from the last, then N."""
    if t.dim() not in (4, 5) or t.is_contiguous():
        return False
    sizes, strides = list(t.shape), list(t.stride())
    if strides[1] == 0:
        return False
    low = 0
    for d in (1, *range(t.dim() - 1, 1, -1), 0):
        if sizes[d] == 0 or strides[d] < low or (d == 0 and low == strides[1]):
            return False
        low = strides[d] * (sizes[d] if sizes[d] > 1 else 1)
    return True


def _dense_copy(x: torch.Tensor, weight: torch.Tensor) -> int:
    """A strided input (CoaT's channel slices of its qkv, an NCHW channel slice) is made
    dense in its format before the kernel reads it; the copy lives through the call."""
    fmt = torch.channels_last if _layout(x, weight) == "nhwc" else torch.contiguous_format
    return 0 if x.is_contiguous(memory_format=fmt) else _nbytes(x.shape)


def _onednn(x: torch.Tensor, weight: torch.Tensor, conv: tuple) -> bool:
    stride, padding, dilation, transposed, output_padding, groups = conv
    if x.device.type != "cpu" or x.dtype != torch.float32 or transposed:
        return False
    if not measured_here():
        return False
    if _layout(x, weight) is None:
        return False
    key = _backend_key(x, weight, conv)
    chosen = _MKLDNN_CHOSEN.get(key) if key is not None else None
    if chosen is None:
        backend = torch._C._select_conv_backend(
            x, weight, None, stride, padding, dilation, transposed, output_padding, groups, None
        )
        chosen = backend == torch._C._ConvBackend.Mkldnn
        if key is not None:
            if len(_MKLDNN_CHOSEN) >= _BACKENDS_KEPT:
                _MKLDNN_CHOSEN.clear()
            _MKLDNN_CHOSEN[key] = chosen
    return chosen


# torch's choice of conv backend by everything it reads: on fake tensors each choice
# dispatches six tensor queries (LRASPP's memory pass on one core: 0.15-0.18 s of its
# 2.0-2.5 s, 1,204 calls)
_MKLDNN_CHOSEN: dict[tuple, bool] = {}
_BACKENDS_KEPT = 4096


def _backend_key(x: torch.Tensor, weight: torch.Tensor, conv: tuple) -> tuple | None:
    """What `select_conv_backend` decides from on a CPU float32 strided input: both
    tensors' sizes, strides and grad flags, the conv's parameters, the thread count and
    whether oneDNN is enabled. None where a size is symbolic (not hashable as is)."""
    try:
        key = (
            tuple(x.shape), x.stride(), x.requires_grad, x.layout,
            tuple(weight.shape), weight.stride(), weight.requires_grad, weight.dtype,
            weight.device,
            tuple(tuple(v) if isinstance(v, (list, tuple)) else v for v in conv),
            torch.get_num_threads(), torch.backends.mkldnn.enabled,
            torch.are_deterministic_algorithms_enabled(),
        )  # fmt: skip
        hash(key)
    except TypeError:
        return None
    return key


def _avx2_unmeasured(x: torch.Tensor, groups: int, stride: Any, mask: Any) -> bool:
    """Backward calls whose AVX2 kernels take other buffers than the formulas here (read
    off the profiler on an AMD EPYC): a first layer's weight gradient (an input copy,
    except at 3 channels), a 3-D conv, and a strided one on fewer channels than two
    blocks. Reported as partial there (a dilated direct conv too: `_backward`)."""
    if not on_avx2():
        return False
    first = _first(x, groups) and bool(mask[1])
    narrow = any(int(n) > 1 for n in stride) and int(x.shape[1]) < 2 * block()
    return first or narrow or x.dim() == 5


def _avx2_nhwc_forward_unmeasured(weight: torch.Tensor, groups: int, stride: Any) -> bool:
    """AVX2's channels-last forward of a dense conv: exact at up to 32 output channels
    (3 shapes), 18 KB over the formula at 64 (another weight blocking), and a 4 KB larger
    scratchpad when strided. Reported as partial there."""
    if not on_avx2() or _depthwise(weight, groups):
        return False
    return int(weight.shape[0]) > 4 * block() or any(int(n) > 1 for n in stride)


def _pointwise(weight: torch.Tensor, stride: Any, padding: Any) -> bool:
    ones = all(k == 1 for k in weight.shape[2:]) and all(s == 1 for s in stride)
    return ones and not any(padding)


def _gemm_possible(x: torch.Tensor, weight: torch.Tensor, dilation: Any) -> bool:
    """oneDNN may run its GEMM forward (an im2col column blocked by a cache heuristic not
    modelled here): from a dilation of 8, or a dilated kernel wider than the input."""
    dims = zip(weight.shape[2:], dilation, strict=False)
    large = any(k > 1 and d >= GEMM_DILATION for k, d in dims)
    return large or _wider_than_input(x, weight, dilation)


@formula(aten.convolution.default)
def _forward(args: tuple, kwargs: dict, out: Any) -> KernelMemory | None:
    x, weight, _, stride, padding, dilation, transposed, output_padding, groups = args
    if not _onednn(x, weight, (stride, padding, dilation, transposed, output_padding, groups)):
        return None
    if _pointwise(weight, stride, padding):
        return KernelMemory()
    copy = _dense_copy(x, weight)
    if _layout(x, weight) == "nhwc":
        scratch = copy + nhwc_forward_scratch(weight, groups)
        return KernelMemory(scratch, partial=_avx2_nhwc_forward_unmeasured(weight, groups, stride))
    scratch = copy + conv_forward_scratch(x, weight, out.shape, groups, stride)
    oc = int(weight.shape[0])
    scratch += _bias_scratch(oc, args[2] is not None and oc % block() != 0)
    # a depthwise kernel wider than its map takes another kernel (less than this)
    wide = _depthwise(weight, groups) and any(
        int(k) > int(n) for k, n in zip(weight.shape[2:], x.shape[2:], strict=False)
    )
    unknown = _gemm_possible(x, weight, dilation) or _grouped(weight, groups) or wide
    unknown = unknown or (on_avx2() and (_dilated(dilation) or x.dim() == 5))
    return KernelMemory(scratch, partial=unknown)


@formula(aten.convolution_backward.default)
def _backward(args: tuple, kwargs: dict, out: Any) -> KernelMemory | None:
    grad_out, x, weight, _, stride, padding, dilation, transposed, output_padding = args[:9]
    groups, mask = args[9], args[10]
    if not _onednn(x, weight, (stride, padding, dilation, transposed, output_padding, groups)):
        return None
    if _pointwise(weight, stride, padding):
        return KernelMemory()
    strided = any(s > 1 for s in stride)
    # other kernels than those measured: per-thread buffers, or AVX2's own
    avx2 = _avx2_unmeasured(x, groups, stride, mask)
    path = _conv3d_path(x, groups, mask)
    if path == "gemm":
        scratch = conv3d_gemm_weights_scratch(x, weight, grad_out)
        return KernelMemory(scratch, partial=torch.get_num_threads() > 1 or avx2)
    unmeasured = bool(mask[1] or mask[2]) and torch.get_num_threads() > 1 or avx2
    copy = _dense_copy(x, weight)
    if _layout(x, weight) == "nhwc":
        scratch, exact = nhwc_backward_scratch(x, weight, groups, mask, padding, dilation)
        direct = _depthwise(weight, groups) and max(int(k) for k in weight.shape[2:]) <= 3
        unknown = not exact or (strided and not direct) or unmeasured
        return KernelMemory(copy + scratch, partial=unknown)
    if x.dim() == 4 and _depthwise(weight, groups):
        scratch, exact = nchw_depthwise_backward_scratch(
            x, weight, grad_out, stride, dilation, mask
        )
        return KernelMemory(copy + scratch, partial=not exact or unmeasured)
    if x.dim() == 4 and groups == 1 and mask[1] and _gemm_backward_weights(x, weight, dilation):
        scratch = copy + conv2d_gemm_weights_scratch(x, weight, grad_out)
        measured = mask[0] and not mask[2]  # measured with the input's gradient, no bias
        return KernelMemory(scratch, partial=unmeasured or not measured)
    scratch = copy + conv_backward_scratch(grad_out, x, weight, groups, strided, mask)
    # on a small map a dilated kernel may take other buffers (blocked columns: up to 3.6x
    # this formula at dilation 2 on 8 and 16 px; exact on 20 shapes of 32 px): reported
    small = _dilated(dilation) and min(int(n) for n in x.shape[2:]) <= DILATED_EXACT_FROM - 1
    small = small or (on_avx2() and _dilated(dilation))  # AVX2: 2.8x this at 32 px
    # from a dilation of 8 oneDNN may take its GEMM backward by a cache-size heuristic
    # (an AMD EPYC: a 3x3 at dilation 12 on 32 px, 2.3 MB against the direct 0.39 MB)
    dims = zip(weight.shape[2:], dilation, strict=False)
    gemm = any(int(k) > 1 and int(d) >= GEMM_DILATION for k, d in dims)
    unknown = small or unmeasured or path == "other" or _grouped(weight, groups) or gemm
    return KernelMemory(scratch, partial=unknown)
