"""Plain views of fake tensors made without the fake mode's dispatch (inspector/fakeviews.py):
the same tensor the fake mode makes, sharing the storage; and the fake mode's own path for
everything the shortcut cannot vouch for."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from inspector.fakevalues import new_fake_mode, value_of
from inspector.fakeviews import PLAIN_VIEWS

aten = torch.ops.aten
CASES = [
    (aten.detach.default, ()),
    (aten.alias.default, ()),
    (aten.t.default, ()),
    (aten.view.default, ([4, 2, 12],)),
    (aten.transpose.int, (0, 2)),
    (aten.permute.default, ([2, 0, 1],)),
    (aten.expand.default, ([5, 8, 3, 4],)),
    (aten.unsqueeze.default, (1,)),
    (aten.squeeze.dim, (0,)),
    (aten.squeeze.dims, ([0],)),
    (aten.slice.Tensor, (1, 1, 3)),
    (aten.select.int, (2, 1)),
    (aten._unsafe_view.default, ([4, 2, 12],)),  # a view autograd does not track as one
]


def _source(func) -> torch.Tensor:
    """A view itself (one row in), so a storage offset and strides are there to keep."""
    x = torch.empty((9, 12) if func is aten.t.default else (9, 3, 4))[1:]
    return x[None] if func.overloadpacket is aten.squeeze else x


def test_every_plain_view_is_tested():
    assert {func for func, _ in CASES} == PLAIN_VIEWS


@pytest.mark.parametrize(("func", "rest"), CASES, ids=lambda c: str(c))
def test_a_plain_view_is_the_fake_modes_own_without_its_dispatch(func, rest, dispatched):
    mode = new_fake_mode()
    with mode:
        x = _source(func)
    expected = FakeTensorMode.dispatch(mode, func, (), (x, *rest), {})
    dispatched.clear()
    with mode:
        out = func(x, *rest)
    assert dispatched == []  # not through the fake mode's dispatch, cache or not
    assert type(out) is FakeTensor and out.fake_mode is mode and out.fake_device == x.fake_device
    assert (out.shape, out.stride(), out.storage_offset(), out.dtype) == (
        expected.shape, expected.stride(), expected.storage_offset(), expected.dtype,
    )  # fmt: skip
    assert out.untyped_storage()._cdata == x.untyped_storage()._cdata  # an alias, no memory


def test_a_view_keeps_autograd_and_the_device_a_fake_claims():
    mode = new_fake_mode()
    with mode:
        w = torch.empty(6, 4, device="cuda" if torch.cuda.is_available() else "cpu")
        w.requires_grad_(True)
        wt = w.t()
        (wt * 2).sum().backward()
    assert wt._is_view() and wt._base is w and wt.grad_fn.name() == "TBackward0"
    assert wt.device == w.device and w.grad.shape == (6, 4)


def test_what_the_shortcut_cannot_vouch_for_takes_the_fake_modes_path(dispatched):
    mode = new_fake_mode()
    with mode:
        ids = torch.arange(6)  # an integer factory: it carries its real value
        plain = torch.empty(2, 3)
    assert value_of(ids) is not None
    dispatched.clear()
    with mode:
        viewed = ids.view(2, 3)  # its value goes with it
        aten.view.default(plain, [3, 2])  # plain: the shortcut
        aten.expand.default(plain, size=[4, 2, 3])  # a keyword argument: the fake path
    # the valued view, then expand's own path (it may decompose): the plain view is not there
    assert dispatched[0] is aten.view.default and aten.view.default not in dispatched[1:]
    assert len(dispatched) > 1
    assert value_of(viewed).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_a_constant_and_a_foreign_fake_take_the_fake_modes_path(dispatched):
    mode, other = new_fake_mode(), new_fake_mode()
    with mode:
        const = torch.tensor(1.5)  # a scalar made in the mode is a constant of it
        assert const.constant is not None
    with other:
        foreign = torch.empty(3)
    dispatched.clear()
    with mode:
        aten.detach.default(const)
    with contextlib.suppress(Exception), mode:  # the fake mode says what it says
        aten.detach.default(foreign)
    assert dispatched == [aten.detach.default, aten.detach.default]
