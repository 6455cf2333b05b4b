"""Fake ops answered from their first call (inspector/fakememo.py): the same tensors the fake
mode makes, fresh each time; and the fake mode's own path for what the memo cannot vouch
for (writes, aliases, values, constants)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from inspector.fakememo import FakeMemo
from inspector.fakerules import FakeRules
from inspector.fakevalues import new_fake_mode, value_of
from inspector.memory.tracker import LiveTracker

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _memo_alone(monkeypatch):
    """The rules (inspector/fakerules.py) answer some of these ops at any size first."""
    monkeypatch.setattr(FakeRules, "key", lambda self, *call: None)


def _meta(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype, t.device, t.untyped_storage().nbytes()


def test_a_repeated_op_is_answered_fresh_and_as_the_fake_mode_made_it(dispatched):
    mode = new_fake_mode()
    with mode:
        a, b = torch.empty(16, 32), torch.empty(32, 8)
        dispatched.clear()
        first = torch.mm(a, b)
        second = torch.mm(a, b)
    assert dispatched == [aten.mm.default]  # the second never reached the fake mode
    assert mode.memo.hits == 1 and type(second) is FakeTensor and second.fake_mode is mode
    assert _meta(second) == _meta(first) == ((16, 8), (8, 1), torch.float32, a.device, 512)
    assert second.untyped_storage()._cdata != first.untyped_storage()._cdata  # a new tensor


def test_strides_dtype_and_plain_arguments_key_the_memo(dispatched):
    mode = new_fake_mode()
    with mode:
        a = torch.empty(16, 32)
        torch.mm(a, torch.empty(32, 8))
        transposed = torch.mm(a, torch.empty(8, 32).t())  # other strides, same shapes
        halves = torch.mm(a.half(), torch.empty(32, 8, dtype=torch.half))
        torch.sum(a, 0)
        torch.sum(a, 1)
    assert dispatched.count(aten.mm.default) == 3 and dispatched.count(aten.sum.dim_IntList) == 2
    assert mode.memo.hits == 0
    assert transposed.shape == (16, 8) and halves.dtype == torch.half


def test_a_tuple_output_comes_back_whole_and_fresh(dispatched):
    mode = new_fake_mode()
    norm_args = (None, None, 4, 32, 9, 8, 1e-5)  # no rule covers it (fakerules.py)
    with mode:
        x = torch.empty(4, 32, 3, 3)
        first = aten.native_group_norm.default(x, *norm_args)
        calls = len(dispatched)  # its meta kernel is a decomposition: its parts come too
        second = aten.native_group_norm.default(x, *norm_args)
    assert len(dispatched) == calls and mode.memo.hits == 1
    assert [_meta(t) for t in second] == [_meta(t) for t in first]
    assert len({t.untyped_storage()._cdata for t in (*first, *second)}) == 6


def test_writes_aliases_values_and_constants_take_the_fake_modes_path(dispatched):
    mode = new_fake_mode()
    with mode:
        x = torch.empty(4, 4)
        ids = torch.arange(4)  # carries its real value
        scale = torch.tensor(2.0)  # a constant of the mode
        for _ in range(2):
            x.add_(1)  # writes its input
            doubled = ids * 2
            scale * 3
    assert value_of(doubled).tolist() == [0, 2, 4, 6]  # the values went on
    assert dispatched.count(aten.add_.Tensor) == 2
    assert dispatched.count(aten.mul.Tensor) == 4  # the valued and the constant, twice each
    keyed = [k[0] for k in mode.memo.outputs]
    assert aten.add_.Tensor not in keyed and aten.mul.Tensor not in keyed


def test_an_output_sharing_an_input_storage_is_not_kept():
    mode = new_fake_mode()
    memo = FakeMemo(mode, lambda t: False)
    with mode:
        x = torch.empty(8)
    key = memo.key(aten.clone.default, (x,), {})
    assert key is not None
    memo.remember(key, (x,), {}, x)  # as if the op had handed its input back
    assert memo.outputs == {}


def _peak_of_a_fake_step(memo_on: bool, monkeypatch) -> tuple[int, int, list]:
    torch.manual_seed(0)
    mode = new_fake_mode()
    if not memo_on:
        monkeypatch.setattr(FakeMemo, "answer", lambda self, key: None)
    with mode:
        model = nn.Sequential(*[nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(),
                                              nn.Linear(64, 32)) for _ in range(6)])  # fmt: skip
        x = torch.empty(8, 32)
    with mode, LiveTracker() as tracker:
        tracker.add_all(list(model.parameters()), "param")
        model(x).pow(2).mean().backward()
    monkeypatch.undo()
    return tracker.peak, mode.memo.hits, [p.live_bytes for p in tracker.points]


def test_a_fake_training_step_tracks_the_same_memory_with_the_memo(monkeypatch):
    peak, hits, points = _peak_of_a_fake_step(True, monkeypatch)
    plain_peak, plain_hits, plain_points = _peak_of_a_fake_step(False, monkeypatch)
    assert hits > 50 and plain_hits == 0  # five of the six blocks answered from the first
    assert (peak, points) == (plain_peak, plain_points)
    # by hand: weights 6 x (2x32 + 32x64 + 64 + 64x32 + 32) floats, plus what the step keeps
    assert peak > 6 * (64 + 2048 + 64 + 2048 + 32) * 4
