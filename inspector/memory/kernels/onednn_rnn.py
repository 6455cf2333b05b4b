"""oneDNN's LSTM on CPU (`aten.mkldnn_rnn_layer`, one call per layer and direction).

Training forward: the outputs, then the bias sum (4H floats), the workspace that backward
reads (kept: it is output 3, saved for backward; fake tensors make it 0 bytes), the
weights reordered to oneDNN's ldigo layout with padded leading dimensions, and a
scratchpad; all but the outputs are freed before the call returns. Backward: zero
gradients for h_n and c_n when the loss does not use them, a contiguous copy of an output
gradient that is not (a batch-first or bidirectional layer's), the bias sum, the weights
in the ldgoi layout where padding changes them, the ldigo copies again and the same
scratchpad. Sizes follow oneDNN's `rnn_utils` (`set_offsets`: every region starts on a
4 KiB page; `get_good_ld`: leading dims rounded to 64 bytes and kept off multiples of
256 elements), checked against the kernel on 144 shapes (a few in tests/test_kernel_memory.py).
Inference (train=False): no workspace; the weights are copied with the gate dimension
rounded up to 128, and the states go into the scratchpad, with the gates of one step (of
every step at batch 1, where oneDNN merges the steps' GEMMs). Checked on 84 shapes, within
80 bytes (the scratchpad is 80 bytes larger when the input and hidden sizes are equal).
Measured on AVX-512; on AVX2 the same, the inference gates rounded to 64 instead of 128
(inference at batch 1 takes more there: reported as partial).
Another dtype than float32, a GRU/RNN mode or a CPU with neither is not modelled: the
call is reported.
"""

from __future__ import annotations

from typing import Any

import torch

from inspector.memory.kernels.registry import (
    KernelMemory,
    formula,
    measured_here,
    on_avx2,
    simd_floats,
)

__all__ = ["lstm_workspace_bytes", "lstm_scratchpad_bytes", "lstm_inference_scratch_bytes"]

aten = torch.ops.aten
PAGE = 4096
F32 = 4
LSTM_MODE, GATES = 2, 4  # ideep::rnn_kind::LSTM; i, f, g, o
# what oneDNN's scratchpad grantor adds, measured: sizes are 4096k + 568 (training), 4096k
# + 776 (inference)
SCRATCHPAD_HEADER, INFERENCE_HEADER = 568, 776
# the inference weights' gate dimension is rounded up to 8 vectors: 128 floats on
# AVX-512, 64 on AVX2 (measured on both)
INFERENCE_GATES_VECTORS = 8


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def good_ld(dim: int, itemsize: int = F32) -> int:
    """oneDNN's leading dimension: 64-byte aligned, not a multiple of 256 (4K aliasing)."""
    ld = _round_up(dim, 64 // itemsize)
    return ld + 64 // itemsize if ld % 256 == 0 else ld


def _pages(*regions: int) -> int:
    return sum(_round_up(r, PAGE) for r in regions)


def lstm_workspace_bytes(steps: int, batch: int, size: int, hidden: int) -> int:
    """Gates, h (ht), states (layer = iter), c states and their diffs, one layer."""
    states = 2 * (steps + 1) * batch  # (layers + 1) x (steps + 1) x batch rows
    wide = good_ld(max(size, hidden))
    return _pages(
        steps * batch * good_ld(GATES * hidden) * F32,  # gates
        steps * batch * good_ld(hidden) * F32,  # ht
        states * wide * F32,  # states (layer and iter share it)
        states * hidden * F32,  # c states
        states * wide * F32,  # diff states, layer
        states * wide * F32,  # diff states, iter
        states * hidden * F32,  # diff c states
    )


def lstm_scratchpad_bytes(steps: int, batch: int, hidden: int) -> int:
    """Scratch gates for every step, h and diff h for one step, the copied bias."""
    return SCRATCHPAD_HEADER + _pages(
        steps * batch * good_ld(GATES * hidden) * F32,
        batch * good_ld(hidden) * F32,
        batch * good_ld(hidden) * F32,
        GATES * hidden * F32,
    )


def lstm_inference_scratch_bytes(steps: int, batch: int, size: int, hidden: int) -> int:
    """Weights, bias sum and scratchpad (states, c states, one step's gates, h, bias)."""
    states = 2 * (steps + 1) * batch
    gates_block = INFERENCE_GATES_VECTORS * (simd_floats() or 16)
    weights = (size + hidden) * _round_up(GATES * hidden, gates_block) * F32
    scratchpad = INFERENCE_HEADER + _pages(
        states * good_ld(max(size, hidden)) * F32,
        states * hidden * F32,
        (steps if batch == 1 else 1) * batch * good_ld(GATES * hidden) * F32,
        batch * good_ld(hidden) * F32,
        GATES * hidden * F32,
    )
    return GATES * hidden * F32 + weights + scratchpad


def _ldigo_weights(size: int, hidden: int) -> int:
    return (size + hidden) * good_ld(GATES * hidden) * F32


def _ldgoi_weights(size: int, hidden: int) -> int:
    """Backward's layout: a copy only where padding changes the PyTorch layout."""
    return sum(GATES * hidden * good_ld(d) * F32 for d in (size, hidden) if good_ld(d) != d)


def _shape(x: torch.Tensor) -> tuple[int, int, int]:
    # time-major whatever the batch_first flag says: aten.lstm transposes a batch-first
    # input before the layer (measured: the workspace is the [steps, batch] one)
    return int(x.shape[0]), int(x.shape[1]), int(x.shape[2])


def _supported(x: torch.Tensor, mode: int) -> bool:
    cpu = x.device.type == "cpu" and measured_here()
    return cpu and x.dtype == torch.float32 and mode == LSTM_MODE


@formula(aten.mkldnn_rnn_layer.default)
def _forward(args: tuple, kwargs: dict, out: Any) -> KernelMemory | None:
    x, hidden, mode, train = args[0], args[10], args[9], args[15]
    if not _supported(x, mode):
        return None
    steps, batch, size = _shape(x)
    if not train:
        scratch = lstm_inference_scratch_bytes(steps, batch, size, hidden)
        # AVX2 at batch 1 takes more (merged steps: 3-67 KB more on 2 shapes): reported
        return KernelMemory(scratch_bytes=scratch, partial=on_avx2() and batch == 1)
    scratch = GATES * hidden * F32 + _ldigo_weights(size, hidden)  # bias sum, weights
    return KernelMemory(
        scratch_bytes=scratch + lstm_scratchpad_bytes(steps, batch, hidden),
        output_bytes={3: lstm_workspace_bytes(steps, batch, size, hidden)},
    )


@formula(aten.mkldnn_rnn_layer_backward.default)
def _backward(args: tuple, kwargs: dict, out: Any) -> KernelMemory | None:
    x, grad_y, grad_hy, grad_cy = args[0], args[10], args[11], args[12]
    mode, hidden = args[14], args[15]
    train = args[18]
    if not (_supported(x, mode) and train):
        return None
    steps, batch, size = _shape(x)
    zeros = sum(batch * hidden * F32 for g in (grad_hy, grad_cy) if g is None)
    # a batch-first (transposed) or bidirectional (sliced) output gradient is copied
    if grad_y is not None and not grad_y.is_contiguous():
        zeros += grad_y.numel() * F32
    # the bias sum and a bias copy; the clone of the bias gradient (an output) comes after
    # the scratch is freed, so it is not on top of it
    scratch = zeros + GATES * hidden * F32 + _ldgoi_weights(size, hidden)
    scratch += _ldigo_weights(size, hidden) + lstm_scratchpad_bytes(steps, batch, hidden)
    return KernelMemory(scratch_bytes=scratch)
