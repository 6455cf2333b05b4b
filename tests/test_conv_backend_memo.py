"""The oneDNN formulas ask torch which conv backend a call takes; the answer is kept by
everything torch decides it from, so a repeated conv costs no fake dispatches."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from inspector.memory.kernels import onednn_conv

# (input shape, weight shape, stride, padding, dilation, groups, channels-last input)
CONVS = [
    ((2, 16, 14, 14), (32, 16, 3, 3), [1, 1], [1, 1], [1, 1], 1, False),
    ((2, 16, 14, 14), (32, 16, 3, 3), [1, 1], [1, 1], [1, 1], 1, True),
    ((1, 32, 7, 7), (32, 1, 3, 3), [2, 2], [1, 1], [1, 1], 32, False),  # depthwise
    ((1, 64, 8, 8), (64, 64, 1, 1), [1, 1], [0, 0], [1, 1], 1, False),  # pointwise
    ((1, 64, 8, 8), (64, 64, 3, 3), [1, 1], [12, 12], [12, 12], 1, False),  # dilated
    ((1, 3, 4, 8, 8), (8, 3, 3, 3, 3), [1, 1, 1], [1, 1, 1], [1, 1, 1], 1, False),  # 3-D
]


def _direct(x, w, conv) -> bool:
    stride, padding, dilation, transposed, output_padding, groups = conv
    backend = torch._C._select_conv_backend(
        x, w, None, stride, padding, dilation, transposed, output_padding, groups, None
    )
    return backend == torch._C._ConvBackend.Mkldnn


def _fake_pair(mode, shape, weight, channels_last):
    with mode:
        x = torch.empty(shape)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        return x, torch.empty(weight)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_kept_answer_is_torchs_own(monkeypatch, threads):
    if not onednn_conv.measured_here():
        pytest.skip("the oneDNN formulas are not used on this CPU")
    monkeypatch.setattr(onednn_conv, "_MKLDNN_CHOSEN", {})
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        mode = FakeTensorMode()
        answers = []
        for shape, weight, stride, padding, dilation, groups, last in CONVS:
            x, w = _fake_pair(mode, shape, weight, last)
            conv = (stride, padding, dilation, False, [0] * len(stride), groups)
            first = onednn_conv._onednn(x, w, conv)
            again = onednn_conv._onednn(x, w, conv)  # from the memo
            assert first == again == _direct(x, w, conv)
            answers.append(first)
        # the memo keyed every call: one entry per distinct conv
        assert len(onednn_conv._MKLDNN_CHOSEN) == len(CONVS)
        assert any(answers)  # not a table of one answer
    finally:
        torch.set_num_threads(before)


def test_a_repeated_conv_asks_torch_once(monkeypatch):
    if not onednn_conv.measured_here():
        pytest.skip("the oneDNN formulas are not used on this CPU")
    monkeypatch.setattr(onednn_conv, "_MKLDNN_CHOSEN", {})
    asked = []
    select = torch._C._select_conv_backend
    monkeypatch.setattr(torch._C, "_select_conv_backend", lambda *a: asked.append(a) or select(*a))
    mode = FakeTensorMode()
    conv = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    for _ in range(3):  # new tensors of the same sizes and strides each time
        x, w = _fake_pair(mode, (2, 16, 14, 14), (32, 16, 3, 3), False)
        onednn_conv._onednn(x, w, conv)
    x, w = _fake_pair(mode, (2, 16, 14, 14), (32, 16, 3, 3), True)  # other strides
    onednn_conv._onednn(x, w, conv)
    assert len(asked) == 2


def test_the_key_sees_what_torch_decides_from():
    mode = FakeTensorMode()
    conv = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    x, w = _fake_pair(mode, (2, 16, 14, 14), (32, 16, 3, 3), False)
    key = onednn_conv._backend_key(x, w, conv)
    x_last, _ = _fake_pair(mode, (2, 16, 14, 14), (32, 16, 3, 3), True)
    assert onednn_conv._backend_key(x_last, w, conv) != key  # strides
    strided = ([2, 2], *conv[1:])
    assert onednn_conv._backend_key(x, w, strided) != key  # the conv's parameters
    before = torch.get_num_threads()
    torch.set_num_threads(before + 1)
    try:
        assert onednn_conv._backend_key(x, w, conv) != key  # the thread count
    finally:
        torch.set_num_threads(before)
    assert onednn_conv._backend_key(x, w, conv) == key
