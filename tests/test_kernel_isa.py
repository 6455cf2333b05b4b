"""The oneDNN formulas per vector ISA: AVX-512 (16-float channel blocks) and AVX2 (8),
each worked out by hand from what the allocator gave on a CPU of that kind (AVX2: an AMD
EPYC, `bench/memory.py kernel-grid|kernel-depthwise|kernel-shapes`). The ISA is set by
hand, so every case runs on any CPU; tests/test_kernel_memory.py checks the formulas of
the CPU it runs on against its allocator."""

from __future__ import annotations

import pytest
import torch
from kernel_models import formulas_of
from torch import nn

from inspector.memory.kernels import registry
from inspector.memory.kernels.onednn_conv import (
    conv_backward_scratch,
    conv_forward_scratch,
    nhwc_backward_scratch,
)
from inspector.memory.kernels.onednn_rnn import lstm_inference_scratch_bytes

aten = torch.ops.aten


@pytest.fixture(params=["AVX512", "AVX2"])
def isa(request, monkeypatch) -> str:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: request.param)
    return request.param


def test_the_block_is_the_isas_float_lanes(isa):
    assert registry.simd_floats() == {"AVX512": 16, "AVX2": 8}[isa]
    assert registry.measured_here() and registry.on_avx2() == (isa == "AVX2")


def test_another_isa_has_no_formula(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert registry.simd_floats() == 0 and not registry.measured_here()


def test_a_24_channel_conv_pads_to_the_block(isa):
    """Conv2d(24, 32, 3) on [2, 24, 32, 32], forward: max(input copy + weight copy + output
    copy, output copy + output) - output. AVX2 blocks 24 channels as they are (3 x 8);
    AVX-512 pads them to 32. Measured: 262,144 (AMD EPYC, AVX2), 299,008 (AVX-512)."""
    x, w = torch.empty(2, 24, 32, 32), torch.empty(32, 24, 3, 3)
    out = 2 * 32 * 32 * 32 * 4  # 262,144, and the blocked output copy the same
    copies = {
        "AVX2": 2 * 24 * 1024 * 4 + 32 * 24 * 9 * 4,  # 196,608 + 27,648
        "AVX512": 2 * 32 * 1024 * 4 + 32 * 32 * 9 * 4,  # 262,144 + 36,864
    }[isa]
    fwd = conv_forward_scratch(x, w, (2, 32, 32, 32), 1, (1, 1))
    assert fwd == max(copies + out, 2 * out) - out
    assert fwd == {"AVX2": 262_144, "AVX512": 299_008}[isa]


def test_twelve_input_channels_are_a_blocked_layer_on_avx2(monkeypatch):
    """12 channels: under AVX-512's 16 a "1st conv", but 12 >= 8 on AVX2, so the input is
    copied padded to 16. Backward, measured on the AMD EPYC: 397,824 B."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    x, w, g = torch.empty(2, 12, 32, 32), torch.empty(32, 12, 3, 3), torch.empty(2, 32, 32, 32)
    s, d = 2 * 16 * 1024 * 4, 2 * 32 * 1024 * 4  # blocked input 131,072, output grad 262,144
    grad_in, weights = 2 * 12 * 1024 * 4, 32 * 16 * 9 * 4  # 98,304; the weight copy 18,432
    end = grad_in + 32 * 12 * 9 * 4 + 32 * 4  # the three gradients: 112,256
    weight_pass = grad_in + d + s + weights + 32 * 4  # the weight gradient's buffers
    by_hand = max(d + weights + s, weight_pass) - end
    bwd = conv_backward_scratch(g, x, w, 1, False, [True, True, True])
    assert bwd == by_hand == 397_824


def test_the_depthwise_reduction_rows_are_the_block_squared(isa):
    # 32 channels, 7 x 7, channels-last: 32 x 49 x rows floats, rows 256 on AVX-512 and 64
    # on AVX2, plus two bias- and two weight-sized buffers less the two gradients
    x, w = torch.empty(4, 32, 32, 32), torch.empty(32, 1, 7, 7)
    rows = {"AVX512": 256, "AVX2": 64}[isa]
    bwd, exact = nhwc_backward_scratch(x, w, 32, [True, True, True], (3, 3), (1, 1))
    assert bwd == 32 * 49 * rows * 4 + 2 * 128 + 2 * 6_272 - (128 + 6_272)
    # measured: 1,612,032 (AVX-512) and 407,808 (AMD EPYC, AVX2)
    assert bwd == {"AVX512": 1_612_032, "AVX2": 407_808}[isa] and exact


def test_lstm_inference_gates_round_to_eight_vectors(isa):
    # (steps 7, batch 3, input 100, hidden 200): the weights' 800 gates round to 896 on
    # AVX-512 and to 832 on AVX2: (100 + 200) x 64 x 4 B apart; measured 1,104,776 on AVX2
    got = lstm_inference_scratch_bytes(7, 3, 100, 200)
    assert got == {"AVX512": 1_181_576, "AVX2": 1_181_576 - 300 * 64 * 4}[isa]
    if isa == "AVX2":
        assert got == 1_104_776


def _partial(conv: nn.Module, x: torch.Tensor) -> tuple[bool, bool]:
    """(forward partial, backward partial): the formulas as the tracker asks them."""
    r = torch.randn(conv(x).shape).to(memory_format=_format(x))
    found = formulas_of(lambda: (conv(x) * r).sum().backward())
    return found[aten.convolution.default].partial, found[aten.convolution_backward.default].partial


def _format(x: torch.Tensor) -> torch.memory_format:
    cl = (
        x.dim() == 4
        and not x.is_contiguous()
        and x.is_contiguous(memory_format=torch.channels_last)
    )
    return torch.channels_last if cl else torch.contiguous_format


def _nhwc(*shape: int) -> torch.Tensor:
    return torch.randn(shape).to(memory_format=torch.channels_last).requires_grad_(True)


@pytest.fixture
def one_thread():
    """oneDNN's per-thread buffers are reported at more threads: one, as measured."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# (conv, input, (forward, backward) partial on AVX2, the same on AVX-512)
_CALLS = [
    # what AVX2 runs through other kernels (read off the AMD EPYC's allocator)
    (nn.Conv2d(64, 64, 3, 1, 2, dilation=2), (2, 64, 32, 32), (True, True), (False, False)),
    (nn.Conv3d(16, 16, 3, 1, 1), (2, 16, 8, 16, 16), (True, True), (False, False)),
    (nn.Conv2d(3, 64, 7, 2, 3), (2, 3, 64, 64), (False, True), (False, False)),  # first layer
    (nn.Conv2d(8, 32, 3, 2, 1), (2, 8, 32, 32), (False, True), (False, False)),  # one block
    (nn.Conv2d(32, 32, 5, 1, 2, groups=32), (2, 32, 8, 8), (False, True), (False, False)),
    (nn.Conv2d(120, 120, 7, 1, 3, groups=120), "nhwc:2,120,2,2", (False, True), (False, False)),
    (nn.Conv2d(64, 64, 3, 1, 1, bias=False), "nhwc:2,64,16,16", (True, False), (False, False)),
    # and what it runs as AVX-512 does, with 8-float blocks
    (nn.Conv2d(64, 64, 3, 1, 1), (2, 64, 32, 32), (False, False), (False, False)),
    (nn.Conv2d(32, 32, 3, 2, 1), (2, 32, 32, 32), (False, False), (False, False)),
    (nn.Conv2d(64, 64, 5, 1, 2, groups=64), (2, 64, 16, 16), (False, False), (False, False)),
]


@pytest.mark.parametrize("conv,x,avx2,avx512", _CALLS)
def test_avx2_reports_the_kernels_it_runs_otherwise(monkeypatch, one_thread, conv, x, avx2, avx512):
    if isinstance(x, str):
        x = _nhwc(*(int(n) for n in x.split(":")[1].split(",")))
    else:
        x = torch.randn(x, requires_grad=True)
    for isa, expected in (("AVX2", avx2), ("AVX512", avx512)):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda isa=isa: isa)
        assert _partial(conv, x) == expected, isa


def test_avx2_lstm_inference_at_batch_1_is_reported(monkeypatch):
    lstm = nn.LSTM(64, 200).eval()

    def forward() -> None:
        with torch.no_grad():
            lstm(torch.randn(50, 1, 64))

    for isa, partial in (("AVX2", True), ("AVX512", False)):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda isa=isa: isa)
        assert formulas_of(forward)[aten.mkldnn_rnn_layer.default].partial == partial
