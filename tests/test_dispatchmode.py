"""Our dispatch modes' hooks run under our own cheap guard (inspector/dispatchmode.py),
not torch's dynamo-disable wrapper, and a compiled region inside them is tracked as its
eager twin, without Dynamo trying to compile the guard."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from inspector.dispatchmode import _GUARD_CODE
from inspector.fakevalues import ValuedFakeTensorMode, new_fake_mode
from inspector.graph.allocated import AllocatedBytes
from inspector.graph.backflops import TrainingFlopCounter
from inspector.graph.lenient import LenientScalars
from inspector.graph.metamemo import MetaMemo
from inspector.memory.tracker import LiveTracker
from inspector.memory.warmup import _SkipInplace, _SkipRealArithmetic


@pytest.mark.parametrize(
    "mode",
    [
        LiveTracker,
        ValuedFakeTensorMode,
        MetaMemo,
        LenientScalars,
        AllocatedBytes,
        TrainingFlopCounter,
        _SkipInplace,
        _SkipRealArithmetic,
    ],
)
def test_the_modes_hooks_run_under_our_guard(mode: type) -> None:
    assert mode.__torch_dispatch__.__code__ is _GUARD_CODE
    own = FakeTensorMode if mode is ValuedFakeTensorMode else mode  # the fake mode's own hook
    assert mode.__torch_dispatch__.__wrapped__.__qualname__ == f"{own.__name__}.__torch_dispatch__"


def _tracked(compiled: bool, fake: bool) -> tuple[int, int]:
    """(ops seen, peak bytes) of a tracked forward and backward through a function that
    is compiled or not."""

    def sine(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2

    inner = torch.compile(sine, backend="eager") if compiled else sine
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8)
    with new_fake_mode() if fake else contextlib.nullcontext():
        x = torch.randn(4, 8)
        tracker = LiveTracker()
        with tracker:
            inner(linear(x)).sum().backward()
    return tracker.op_count, tracker.peak


@pytest.mark.parametrize("fake", [False, True])
def test_a_compiled_region_is_tracked_as_its_eager_twin(fake: bool) -> None:
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = _tracked(compiled=True, fake=fake)
    assert not [w for w in caught if "Dynamo" in str(w.message)]  # it left the guard alone
    eager = _tracked(compiled=False, fake=fake)
    assert compiled == eager
    # forward: linear's addmm (and the weight's transpose), sin, mul, sum; then backward
    assert compiled[0] >= 8
    torch._dynamo.reset()
