"""Fake copies of a model: plain tensor attributes become fresh fakes and no FakeTensorMode
is ever copied (copying one duplicated its storage weak references: a heap corruption that
aborted torchvision's Faster R-CNN under --fake at the next garbage collection)."""

from __future__ import annotations

import gc

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from inspector.memory.shadow import fake_shadow, tensor_attributes


class Anchored(nn.Module):
    """Like torchvision's AnchorGenerator: tensors in a plain list attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.cell_anchors = [torch.zeros(3, 4), torch.ones(2, 4)]
        self.scale = torch.tensor(2.0)


def test_tensor_attributes_finds_lists_and_plain_attributes() -> None:
    model = Anchored()
    found = tensor_attributes(model)
    assert [tuple(t.shape) for t in found] == [(3, 4), (2, 4), ()]


class Varied(nn.Module):
    """Attributes of every kind a module holds: flags, sizes, dtypes, empty and full
    containers, a tensor in a dict of lists and in a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.flag, self.size, self.eps, self.name = True, 3, 1e-5, "x"
        self.dtype, self.device, self.nothing = torch.float32, torch.device("cpu"), None
        self.empty_list, self.empty_dict, self.empty_tuple = [], {}, ()
        self.table = {"a": [torch.zeros(1), 2], "b": (torch.ones(2),)}
        self.pair = (torch.zeros(3), "y")


def test_tensor_attributes_skips_nothing_that_holds_a_tensor() -> None:
    """The same tensors, in the same order, as flattening every attribute finds."""
    from torch.utils._pytree import tree_flatten

    model = Varied()
    flattened = [
        t
        for module in model.modules()
        for name, value in vars(module).items()
        if name not in ("_parameters", "_buffers", "_modules")
        for t in tree_flatten(value)[0]
        if isinstance(t, torch.Tensor)
    ]
    found = tensor_attributes(model)
    assert [tuple(t.shape) for t in found] == [(1,), (2,), (3,)]
    assert all(a is b for a, b in zip(found, flattened, strict=True))


def test_shadow_fakes_plain_attributes_and_keeps_the_mode() -> None:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model = Anchored()
    # The fake mode has converted a real tensor: its converter now holds weak references.
    mode.from_tensor(torch.randn(5))
    shadow = fake_shadow(model, mode)
    for mine, theirs in zip(model.cell_anchors, shadow.cell_anchors, strict=True):
        assert isinstance(theirs, FakeTensor) and theirs is not mine
        assert theirs.fake_mode is mode  # the mode itself, not a copy of it
        assert theirs.shape == mine.shape
    assert shadow.scale.fake_mode is mode
    assert shadow.conv.weight.fake_mode is mode and shadow.conv.weight is not model.conv.weight
    del shadow
    gc.collect()  # where the copied mode used to corrupt the heap


def test_shadow_of_a_real_model_fakes_its_attributes() -> None:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = Anchored()
    shadow = fake_shadow(model, mode)
    assert all(isinstance(t, FakeTensor) for t in shadow.cell_anchors)
    assert model.cell_anchors[1].sum().item() == 8.0  # the user's tensors are untouched


def test_a_tensor_given_twice_stays_one_fake_tensor() -> None:
    """HF's `{"input_ids": ids, "labels": ids}`: one tensor in memory, so one fake."""
    from inspector.context import Inputs
    from inspector.memory.shadow import fake_inputs, new_fake_mode

    ids, other = torch.zeros(4, 128, dtype=torch.long), torch.zeros(4, 128, dtype=torch.long)
    fake = fake_inputs(Inputs(args=(ids,), kwargs={"labels": ids, "mask": other}), new_fake_mode())
    assert fake.kwargs["labels"] is fake.args[0] and fake.kwargs["mask"] is not fake.args[0]
    distinct = {id(t): t for t in fake.tensors()}.values()
    assert sum(t.numel() * t.element_size() for t in distinct) == 2 * 4 * 128 * 8  # 8,192 B
