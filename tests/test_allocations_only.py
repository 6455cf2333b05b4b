"""The measured step's optimizer makes its allocations without its arithmetic
(inspector/memory/warmup.py `allocations_only`): the figures are the real step's to the
byte, and no value of the copy is written."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from seen_ops import SeenOps

from inspector.context import Inputs
from inspector.memory import measure as measure_module
from inspector.memory.optimizer import make_optimizer
from inspector.memory.step import StepOptions
from inspector.memory.warmup import allocations_only


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))


def _inputs() -> Inputs:
    return Inputs((torch.randn(8, 32),), {})


def _real_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The phase as it ran before: the copy filled, the state zeroed, the step computed."""
    monkeypatch.setattr(measure_module, "allocations_only", nullcontext)
    monkeypatch.setattr(measure_module, "_valueless", lambda opts: nullcontext())


def _phase_figures(name: str, inference: int | None) -> dict:
    phase = measure_module.measure_optimizer_phase(
        _model(), _inputs(), StepOptions(optimizer=name), inference
    )
    return {k: v for k, v in vars(phase).items() if k != "seconds"}


@pytest.mark.parametrize("name", ["adamw", "adam", "momentum", "sgd"])
@pytest.mark.parametrize("inference", [None, 4096])
def test_the_optimizer_phase_has_the_real_steps_figures(
    name: str, inference: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    skipped = _phase_figures(name, inference)
    _real_arithmetic(monkeypatch)
    assert skipped == _phase_figures(name, inference)
    weights = (32 * 64 + 64 + 64 * 4 + 4) * 4
    # the copy of the weights and the 8 x 32 input, then the state: Adam's two moments and
    # four float32 step counters, one momentum buffer per weight, nothing for SGD
    assert skipped["setup_bytes"] == weights + 8 * 32 * 4
    state = {"adamw": 2 * weights + 4 * 4, "adam": 2 * weights + 4 * 4, "momentum": weights}
    state = state.get(name, 0)
    assert skipped["resident_bytes"] == skipped["setup_bytes"] + state
    assert skipped["with_grads_bytes"] == skipped["resident_bytes"] + weights


def test_adams_step_peaks_with_the_copies_its_kernels_make_of_python_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real step's peak is the largest weight's two denominators (`sqrt`, then its
    division by a Python number), that number wrapped in an 8-byte float64 tensor, and the
    4-byte float32 copy the CPU kernel makes of it: a skipped division that made only its
    output would peak 4 bytes lower."""
    figures = _phase_figures("adamw", 4096)
    largest = 32 * 64 * 4
    assert figures["step_peak_bytes"] == figures["with_grads_bytes"] + 2 * largest + 8 + 4
    monkeypatch.setattr("inspector.memory.warmup._cast_numbers", lambda func, args: None)
    assert _phase_figures("adamw", 4096)["step_peak_bytes"] == figures["step_peak_bytes"] - 4


@pytest.mark.parametrize("name", ["adamw", "momentum"])
def test_the_whole_measured_step_is_the_same(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The separate measured step (a real forward and backward, then the optimizer)."""

    def figures() -> tuple:
        m = measure_module.measure(_model(), _inputs(), StepOptions(optimizer=name))
        return m.forward_peak_bytes, m.saved_activation_bytes, m.train_peak_bytes

    skipped = figures()
    _real_arithmetic(monkeypatch)
    assert skipped == figures()


def test_no_value_is_written() -> None:
    """The state and gradients are allocated, not filled; the copy's weights are allocated,
    not copied; the step's updates and denominators never reach a kernel."""
    params = [torch.nn.Parameter(torch.randn(6, 4)), torch.nn.Parameter(torch.randn(4))]
    before = [p.detach().clone() for p in params]
    optimizer = make_optimizer("adamw", params)
    with SeenOps() as seen, allocations_only():  # seen: what gets past the skipping
        copies = [p.detach().clone() for p in params]
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
    assert all(torch.equal(p, b) for p, b in zip(params, before, strict=True))
    assert [c.shape for c in copies] == [p.shape for p in params]
    assert not {"clone", "zeros_like", "zero_", "sqrt", "div", "lerp_", "addcdiv_", "mul_"} & set(
        seen.ops
    )
    # the step counters still count: a 0-dim tensor is not skipped
    assert [state["step"].item() for state in optimizer.state.values()] == [1.0, 1.0]


def test_an_update_by_a_tensor_of_another_dtype_runs() -> None:
    """Its kernel copies the other tensor to the common dtype first: not allocation-free,
    so it is not skipped."""
    target, wider, same = torch.zeros(4), torch.ones(4, dtype=torch.float64), torch.ones(4)
    with SeenOps() as seen, allocations_only():  # seen: what gets past the skipping
        target.add_(wider)
        target.mul_(same)
    assert seen.ops == ["add_"]
    assert target.tolist() == [1.0] * 4


class _ScaledHead(torch.nn.Module):
    """A 0-dim weight (CLIP's `logit_scale`): its state and updates are 0-dim tensors."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(32, 4)
        self.scale = torch.nn.Parameter(torch.tensor(2.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * self.scale


@pytest.mark.parametrize("name", ["adamw", "momentum"])
def test_a_zero_dim_weights_updates_allocate_as_the_real_steps(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its momentum's update by a Python number, run through the mode, would wrap the
    number once more than the optimizer's own call: the measured peak 8 bytes high."""

    def figures() -> dict:
        phase = measure_module.measure_optimizer_phase(
            _ScaledHead(), _inputs(), StepOptions(optimizer=name), 4096
        )
        return {k: v for k, v in vars(phase).items() if k != "seconds"}

    skipped = figures()
    _real_arithmetic(monkeypatch)
    assert skipped == figures()


def test_the_step_counters_still_count() -> None:
    """A 0-dim counter's `+= 1` is added by value (Adam reads it), not skipped."""
    params = [torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.tensor(1.0))]
    optimizer = make_optimizer("adam", params)
    with allocations_only():
        for _ in range(3):
            for p in params:
                p.grad = torch.zeros_like(p)
            optimizer.step()
    assert [state["step"].item() for state in optimizer.state.values()] == [3.0, 3.0]
