"""The real measurement (memory/measure.py) runs two forwards: an inference one and the
training step, whose forward and loss are the window that measures the saved bytes
(issue #17). The saved bytes are worked out by hand here, the inputs autograd keeps
included."""

from __future__ import annotations

import torch
from torch import nn

from inspector.context import Inputs
from inspector.memory.measure import measure
from inspector.memory.step import StepOptions

F32, I64 = 4, 8


class Counted(nn.Module):
    """Counts its forwards (a class counter: the measurement runs on a deep copy)."""

    calls = 0

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        Counted.calls += 1
        return self.body(x)


def test_an_mlps_saved_bytes_are_its_input_and_its_relu_output() -> None:
    Counted.calls = 0
    model = Counted(nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10)))
    got = measure(model, Inputs((torch.randn(64, 784),), {}), StepOptions())
    # Linear 1 saves its input x; ReLU saves its output, which Linear 2 saves too (one
    # tensor); the loss is left out
    assert got.saved_activation_bytes == 64 * 784 * F32 + 64 * 512 * F32
    assert Counted.calls == 2  # the inference forward and the step's


def test_token_ids_that_the_embedding_saves_are_counted() -> None:
    model = Counted(nn.Sequential(nn.Embedding(1000, 64), nn.Linear(64, 64)))
    ids = torch.randint(0, 1000, (8, 512))
    got = measure(model, Inputs((ids,), {}), StepOptions())
    # the embedding saves the ids for its backward, Linear its input
    assert got.saved_activation_bytes == 8 * 512 * I64 + 8 * 512 * 64 * F32


def test_recording_allocations_only_measures_what_the_full_profile_does(monkeypatch) -> None:
    """The meter records allocations and its own windows, not an event per op; the
    public profiler, which records everything (the fallback where torch's private
    entry points differ), measures the same bytes. Both are checked against hand sums."""
    from inspector.memory import allocations as allocations_module

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 8))
    inputs = Inputs((torch.randn(32, 256),), {})
    assert allocations_module._user_scope_config() is not None  # this torch: the short path
    short = measure(model, inputs, StepOptions(optimizer="sgd"))
    monkeypatch.setattr(allocations_module, "_user_scope_config", lambda: None)
    full = measure(model, inputs, StepOptions(optimizer="sgd"))
    assert (short.train_peak_bytes, short.forward_peak_bytes) == (
        full.train_peak_bytes,
        full.forward_peak_bytes,
    )
    # the input, and ReLU's output (saved by ReLU and the second Linear: one tensor)
    assert (
        short.saved_activation_bytes == full.saved_activation_bytes == (32 * 256 + 32 * 128) * F32
    )


def test_a_block_from_an_earlier_recording_freed_during_the_step_is_not_the_steps() -> None:
    """The profiler reports freeing a block any earlier recording in the process saw
    allocated (here: a tensor the step's hook lets go, as the garbage collector lets go
    of one an earlier test kept in a cycle); the step never had those bytes."""
    from inspector.memory.allocations import allocations_recorded

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 8))
    inputs = Inputs((torch.randn(32, 256),), {})
    plain = measure(model, inputs, StepOptions(optimizer="sgd"))

    kept = {}
    with allocations_recorded():
        kept["old"] = torch.ones(10_000)  # 40,000 bytes, seen allocated by that recording

    def let_go(module, args, output):  # noqa: ANN001, ANN202
        if module.training:
            kept.clear()

    model[0].register_forward_hook(let_go)
    freed = measure(model, inputs, StepOptions(optimizer="sgd"))
    assert not kept
    assert (freed.train_peak_bytes, freed.saved_activation_bytes) == (
        plain.train_peak_bytes,
        plain.saved_activation_bytes,
    )
