"""`fakenew.FakeMaker`: a fake tensor made without `FakeTensor.__new__` is the one it makes,
attribute for attribute, dispatch key for dispatch key, and behaves the same."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from inspector.fakenew import FakeMaker
from inspector.fakevalues import new_fake_mode


def _both(mode, shape=(2, 3), device=torch.device("cpu"), dtype=torch.float32):  # noqa: ANN001, ANN202
    maker = FakeMaker(mode)
    assert maker.template is not None  # this torch takes the quick way
    made = maker.new(torch.empty(shape, dtype=dtype, device="meta"), device)
    ordinary = FakeTensor(mode, torch.empty(shape, dtype=dtype, device="meta"), device)
    return made, ordinary


def _data_ptr(t: torch.Tensor) -> type | None:
    """What asking for the data pointer raises (its warning is given once a process)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            t.data_ptr()
        except Exception as exc:  # noqa: BLE001 - the kind of failure is what is compared
            return type(exc)
    return None


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_a_made_fake_is_the_ordinary_one(device: str) -> None:
    mode = new_fake_mode()
    made, ordinary = _both(mode, device=torch.device(device))
    assert type(made) is FakeTensor
    assert vars(made) == vars(ordinary)
    assert made.device == ordinary.device == torch.device(device)
    assert torch._C._dispatch_keys(made) == torch._C._dispatch_keys(ordinary)
    assert (made.shape, made.stride(), made.dtype) == ((2, 3), (3, 1), torch.float32)
    assert _data_ptr(made) == _data_ptr(ordinary)
    # ops on it are fake ops of the mode, on its device
    with mode:
        out = made @ ordinary.t()
    assert type(out) is FakeTensor and out.fake_mode is mode and out.shape == (2, 2)
    assert out.device == torch.device(device)


def test_the_data_pointer_guard_follows_the_mode() -> None:
    mode = new_fake_mode()
    made, ordinary = _both(mode)
    assert mode._allow_unsafe_data_ptr_access  # torch's default: a deprecation warning
    assert _data_ptr(made) is _data_ptr(ordinary) is None
    mode._allow_unsafe_data_ptr_access = False
    made, ordinary = _both(mode)
    assert _data_ptr(made) is _data_ptr(ordinary) is RuntimeError


def test_a_made_fake_trains_as_the_ordinary_one() -> None:
    """Autograd on fakes made both ways: the same gradient shapes and devices."""
    mode = new_fake_mode()
    made, ordinary = _both(mode, shape=(4, 3))
    with mode:
        w = torch.nn.Parameter(ordinary)
        loss = (made.requires_grad_() * w).sum()
        loss.backward()
    assert made.grad.shape == w.grad.shape == (4, 3)
    assert type(made.grad) is FakeTensor and made.grad.fake_mode is mode


def test_in_debug_mode_the_ordinary_constructor_runs(monkeypatch) -> None:  # noqa: ANN001
    from torch._subclasses.fake_tensor import FakeTensorConfig

    mode = new_fake_mode()
    maker = FakeMaker(mode)
    monkeypatch.setattr(FakeTensorConfig, "debug", True)
    made = maker.new(torch.empty(2, device="meta"), torch.device("cpu"))
    assert hasattr(made, "_debug_trace")  # set only by FakeTensor.__new__


def test_a_shadows_fake_copy_is_the_one_the_modes_empty_strided_makes() -> None:
    """inspector/memory/shadow.py makes the model's fake weights with the maker: the same
    tensor as `empty_strided` under the mode, strides, values of integer tensors and
    Parameter-ness included."""
    from inspector.fakevalues import value_of
    from inspector.memory.shadow import _fake_like

    mode = new_fake_mode()
    ids = torch.arange(6).view(2, 3).t()  # a transposed stride
    for t in (torch.randn(3, 4), torch.nn.Parameter(torch.randn(5)), ids):
        made = _fake_like(t, mode)
        with mode:
            ordinary = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        assert type(made) is FakeTensor or isinstance(made, torch.nn.Parameter)
        assert (made.shape, made.stride(), made.dtype) == (t.shape, t.stride(), t.dtype)
        assert made.fake_mode is mode and made.device == ordinary.device
        assert made.requires_grad == t.requires_grad
        assert torch._C._dispatch_keys(made) == torch._C._dispatch_keys(ordinary)
        skip = {"_is_param", "_inspector_value"}  # set by nn.Parameter; the value, below
        assert {k: v for k, v in vars(made).items() if k not in skip} == vars(ordinary)
    assert torch.equal(value_of(_fake_like(ids, mode)), ids)
