"""Fake ops answered by rule at any size (inspector/fakerules.py): the same tensors the fake
mode makes, at sizes the first call never saw; and the fake mode's own path where the rule
and torch disagree, or the call is outside the rule."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from inspector.context import Inputs
from inspector.fakerules import FakeRules, channels_last_strides, contiguous_strides
from inspector.fakevalues import new_fake_mode
from inspector.memory.shadow import fake_shadow
from inspector.memory.step import StepOptions, train_step

aten = torch.ops.aten
CL = torch.channels_last


def _meta(t: torch.Tensor | None) -> tuple | None:
    if t is None:
        return None
    return tuple(t.shape), t.stride(), t.dtype, t.device, t.untyped_storage().nbytes()


def _metas(out) -> list:
    return [_meta(t) for t in ((out,) if isinstance(out, torch.Tensor) or out is None else out)]


def _calls(n: int, dtype: torch.dtype = torch.float32, fmt=torch.contiguous_format) -> list:
    """(op, args) pairs at batch n, the kinds of call a CNN's and a transformer's step make."""
    x = torch.empty(n, 6, 5, 7, dtype=dtype).contiguous(memory_format=fmt)
    g = torch.empty_like(x)
    c = [torch.empty(6, dtype=dtype) for _ in range(4)]
    rows = torch.empty(n, 9, 16, dtype=dtype)
    w16 = torch.empty(16, dtype=dtype)
    conv = torch.empty(4, 3, 3, 2, dtype=dtype).contiguous(memory_format=fmt)  # groups=2
    up = torch.empty(6, 2, 4, 3, dtype=dtype)  # transposed: in, out, kernel
    video = torch.empty(n, 6, 4, 5, 7, dtype=dtype)
    conv3d = torch.empty(8, 6, 3, 3, 3, dtype=dtype)
    return [
        (aten.native_batch_norm.default, (x, c[0], c[1], c[2], c[3], True, 0.1, 1e-5)),
        (aten.native_batch_norm.default, (x, None, None, c[2], c[3], False, 0.1, 1e-5)),
        (aten.native_batch_norm_backward.default,
         (g, x, c[0], c[2], c[3], c[0], c[1], True, 1e-5, [True, True, True])),
        (aten.native_batch_norm_backward.default,
         (g, x, None, c[2], c[3], c[0], c[1], True, 1e-5, [True, False, False])),
        (aten.native_layer_norm.default, (rows, [16], w16, w16, 1e-5)),
        (aten.native_layer_norm_backward.default,
         (rows, rows, [16], torch.empty(n, 9, 1, dtype=dtype), torch.empty(n, 9, 1, dtype=dtype),
          w16, w16, [True, True, False])),
        (aten._softmax.default, (rows, -1, False)),
        (aten._softmax_backward_data.default, (rows, rows, -1, dtype)),
        (aten.hardswish.default, (x,)),
        (aten.hardswish_backward.default, (g, x)),
        (aten.gelu_backward.default, (rows, rows)),
        (aten.threshold_backward.default, (g, x, 0)),
        (aten.mul.Tensor, (x, torch.empty((), dtype=dtype))),  # a 0-dim tensor broadcasts
        (aten.mul.Tensor, (torch.empty(n, 6, 1, 1, dtype=dtype), x)),  # a squeeze-excite scale
        (aten.add.Tensor, (torch.empty(n, 1, 7, dtype=dtype), torch.empty(5, 1, dtype=dtype))),
        (aten.gt.Scalar, (x, 0.5)),  # bool out
        (aten.convolution.default, (x, conv, None, [2, 1], [1, 0], [1, 2], False, [0, 0], 2)),
        (aten.convolution.default, (x, up, None, [2, 2], [1, 1], [1, 1], True, [1, 0], 1)),
        (aten.convolution_backward.default,
         (torch.empty(n, 4, 3, 5, dtype=dtype), x, conv, [4], [2, 1], [1, 0], [1, 2], False, [0, 0],
          2, [True, True, True])),
        (aten.convolution.default, (video, conv3d, None, [1], [1], [1], False, [0], 1)),
        (aten.mean.dim, (x, [-1, -2], True)),
        (aten.sum.dim_IntList, (x, [0, 2])),
        (aten.amax.default, (rows, [-1])),
        (aten.addmm.default, (w16, rows[0], torch.empty(16, 16, dtype=dtype).t())),
        (aten.bmm.default, (rows, torch.empty(n, 16, 3, dtype=dtype))),
    ]  # fmt: skip


def _run(mode, n: int, dtype: torch.dtype, fmt) -> list:
    with mode:
        return [_metas(op(*args)) for op, args in _calls(n, dtype, fmt)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL])
def test_a_call_at_another_size_is_answered_as_the_fake_mode_makes_it(dispatched, dtype, fmt):
    mode = new_fake_mode()
    _run(mode, 2, dtype, fmt)  # the first call of each key takes torch's path
    dispatched.clear()
    before = mode.rules.hits
    answered = _run(mode, 8, dtype, fmt)
    ops = {op for op, _ in _calls(1)}
    assert not ops & set(dispatched)  # none of them reached the fake mode's dispatch
    assert mode.rules.hits - before >= len(_calls(1))  # (a composite op may call another)

    torch_mode = new_fake_mode()
    torch_mode.rules.key = lambda *call: None  # no rules: what torch makes
    assert answered == _run(torch_mode, 8, dtype, fmt)
    # by hand, where the rule decides: the batch norm's statistics are one per channel in
    # training and none in eval; a layer norm's one per row, kept dims of 1
    assert answered[0][1][:2] == ((6,), (1,)) and answered[1][1][:2] == ((0,), (1,))
    assert answered[3][1:] == [None, None]  # the mask asked for the input's gradient only
    assert answered[4][1][:2] == ((8, 9, 1), (9, 1, 1))
    expected_strides = (channels_last_strides if fmt == CL else contiguous_strides)((8, 6, 5, 7))
    assert answered[8][0][:3] == ((8, 6, 5, 7), expected_strides, dtype)
    assert answered[15][0][2] == torch.bool  # gt
    assert answered[14][0][:2] == ((8, 5, 7), (35, 7, 1))  # [8, 1, 7] + [5, 1]
    # convolutions: rows (5 + 2 * 1 - 1 * (3 - 1) - 1) // 2 + 1 = 3, columns
    # (7 - 2 * (2 - 1) - 1) // 1 + 1 = 5; transposed: (5 - 1) * 2 - 2 * 1 + (4 - 1) + 1 + 1
    # = 11 rows, (7 - 1) * 2 - 2 * 1 + (3 - 1) + 0 + 1 = 13 columns
    shapes = [a[0][0] for a in answered[16:]]
    assert shapes[:2] == [(8, 4, 3, 5), (8, 2, 11, 13)]
    assert [g[0] for g in answered[18]] == [(8, 6, 5, 7), (4, 3, 3, 2), (4,)]
    assert shapes[3:] == [(8, 8, 4, 5, 7), (8, 6, 1, 1), (6, 7), (8, 9), (9, 16), (8, 9, 3)]


def test_outputs_are_fresh_tensors_of_the_mode_and_known_to_the_memo():
    mode = new_fake_mode()
    with mode:
        x, y = torch.empty(2, 3), torch.empty(5, 3)
        torch.nn.functional.hardswish(x)
        first, second = torch.nn.functional.hardswish(y), torch.nn.functional.hardswish(y)
    # the second call, at the first's sizes, is the memo's (inspector/fakememo.py): cheaper
    assert mode.rules.hits == 1 and mode.memo.hits == 1
    assert _metas(second) == _metas(first)
    assert type(first) is FakeTensor and first.fake_mode is mode and first.device == y.device
    assert first.untyped_storage()._cdata != second.untyped_storage()._cdata


def test_a_key_where_torch_disagrees_with_the_rule_stays_torchs(dispatched):
    mode = new_fake_mode()
    with mode:
        # clone is tagged pointwise, but its memory_format argument lays the output out
        # otherwise: the first call shows the rule wrong for this key
        for n in (2, 3, 4):
            out = torch.empty(n, 4, 5, 6).clone(memory_format=CL)
            assert out.stride() == channels_last_strides((n, 4, 5, 6))
    assert dispatched.count(aten.clone.default) == 3 and mode.rules.hits == 0
    assert None in mode.rules.dtypes.values()


def test_calls_outside_the_rules_take_the_fake_modes_path(dispatched):
    mode = new_fake_mode()
    with mode:
        for n in (2, 3):
            x = torch.empty(n, 4, 5)
            x[:, 1:] * 2  # a slice: it starts inside its storage
            x.transpose(1, 2) + 1  # a view's strides, which a kernel need not keep
            torch.arange(n) * 2  # carries its real value (inspector.fakevalues)
    assert dispatched.count(aten.mul.Tensor) == 4 and dispatched.count(aten.add.Tensor) == 2
    assert mode.rules.hits == 0


def test_the_key_leaves_out_sizes_only():
    mode = new_fake_mode()
    rules: FakeRules = mode.rules
    with mode:
        keys = {
            name: rules.key(aten.hardswish.default, (x,), {})
            for name, x in {
                "a": torch.empty(2, 3, 4, 5), "b": torch.empty(7, 9, 4, 5),
                "ones": torch.empty(2, 3, 1, 1), "half": torch.empty(2, 3, 4, 5).half(),
                "cl": torch.empty(2, 3, 4, 5).contiguous(memory_format=CL),
            }.items()
        }  # fmt: skip
    assert keys["a"] == keys["b"]
    assert len({keys[k] for k in ("a", "ones", "half", "cl")}) == 4


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Hardswish(),
            nn.Conv2d(8, 16, 3), nn.BatchNorm2d(16), nn.ReLU(),
        )  # fmt: skip
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.convs(x).flatten(2).transpose(1, 2)  # [N, positions, 16]
        h = torch.nn.functional.gelu(self.norm(h)).softmax(-1)
        return self.head(h.mean(1))


def _fake_steps(rules_on: bool, monkeypatch) -> tuple[list, int]:
    torch.manual_seed(0)
    mode = new_fake_mode()
    if not rules_on:
        monkeypatch.setattr(FakeRules, "key", lambda self, *call: None)
    shadow = fake_shadow(_Net(), mode)
    opts = StepOptions(fake_mode=mode, loss_fn=lambda out, inputs: out.sum())
    steps = []
    for batch, autocast in ((2, None), (5, None), (5, torch.bfloat16)):
        with mode:
            x = torch.empty(batch, 3, 12, 12)
        step = train_step(shadow, Inputs(args=(x,)), replace(opts, autocast=autocast))
        steps.append((step.peak_bytes, step.saved_bytes, [p.live_bytes for p in step.points]))
    monkeypatch.undo()
    return steps, mode.rules.hits


def test_a_fake_training_step_tracks_the_same_memory_with_the_rules(monkeypatch):
    steps, hits = _fake_steps(True, monkeypatch)
    plain, plain_hits = _fake_steps(False, monkeypatch)
    assert hits > 10 and plain_hits == 0  # the steps at batch 5 answered by rule
    assert steps == plain
    # by hand: batch 5's saved activations grow by 5/2 of batch 2's (every one is per sample)
    assert steps[1][1] > 2 * steps[0][1]


def test_an_op_writing_its_input_hands_that_tensor_back(dispatched):
    mode = new_fake_mode()
    with mode:
        for n in (2, 3):
            x = torch.empty(n, 4, 5)
            written = torch.nn.functional.hardswish(x, inplace=True)
            added = x.add_(torch.empty(n, 4, 5))
            broadcast = x.add_(torch.empty(4, 1))
            view = x.add_(x[:, :, :1])  # a view's strides: outside the rule, torch's path
            assert written is x and added is x and broadcast is x and view is x
    assert dispatched.count(aten.hardswish_.default) == 1  # batch 3 answered by rule
    assert dispatched.count(aten.add_.Tensor) == 4  # the view's both times


def test_a_call_torch_refuses_is_still_refused_at_a_known_key():
    mode = new_fake_mode()
    conv_args = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    with mode:
        weight = torch.empty(4, 6, 3, 3)
        aten.convolution.default(torch.empty(2, 6, 8, 8), weight, None, *conv_args)
        aten.mm.default(torch.empty(2, 3), torch.empty(3, 5))
        norm = torch.empty(8)
        aten.native_layer_norm.default(torch.empty(2, 8), [8], norm, norm, 1e-5)
        hits = mode.rules.hits
        with pytest.raises(RuntimeError):  # 5 channels into a weight that takes 6
            aten.convolution.default(torch.empty(2, 5, 8, 8), weight, None, *conv_args)
        with pytest.raises(RuntimeError):
            aten.mm.default(torch.empty(2, 3), torch.empty(4, 5))
        with pytest.raises(RuntimeError):  # normalizes 8 values with 9 weights
            nine = torch.empty(9)
            aten.native_layer_norm.default(torch.empty(2, 8), [8], nine, nine, 1e-5)
    assert mode.rules.hits == hits
