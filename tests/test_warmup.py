"""The optimizer warm-up on fake tensors skips its in-place arithmetic and allocates the
same state as the full step (inspector/memory/warmup.py)."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from seen_ops import SeenOps

from inspector.fakevalues import new_fake_mode
from inspector.memory.optimizer import make_optimizer, state_bytes_of
from inspector.memory.step import warm_up
from inspector.memory.warmup import skipped_inplace_arithmetic


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.empty(6, 4)), torch.nn.Parameter(torch.empty(4).bfloat16())]


def _state(optimizer: torch.optim.Optimizer) -> list[tuple]:
    out = []
    for state in optimizer.state.values():
        for key, v in sorted(state.items()):
            out.append((key, tuple(v.shape), v.stride(), v.dtype, str(v.device)))
    return out


@pytest.mark.parametrize("name", ["adamw", "sgd", "momentum"])
def test_skipped_step_allocates_the_same_state(name: str) -> None:
    with new_fake_mode():
        states = []
        for skip in (False, True):
            params = _params()
            optimizer = make_optimizer(name, params)
            for p in params:
                p.grad = torch.zeros_like(p)
            with skipped_inplace_arithmetic() if skip else nullcontext():
                optimizer.step()
            states.append((_state(optimizer), state_bytes_of(optimizer)))
    assert states[0] == states[1]
    # adamw: 2 moments of 24 + 4 values (4 B and 2 B) and 2 float32 step scalars
    expected = {"adamw": 2 * (24 * 4 + 4 * 2) + 2 * 4, "sgd": 0, "momentum": 24 * 4 + 4 * 2}
    assert states[1][1] == expected[name]


def test_warm_up_skips_the_arithmetic_but_counts_the_step() -> None:
    with new_fake_mode():
        params = _params()
        optimizer = make_optimizer("adamw", params)
        with SeenOps() as seen:  # entered first: below the skipping mode warm_up enters
            warm_up(optimizer, params)
        steps = [optimizer.state[p]["step"].item() for p in params]
    assert steps == [1.0, 1.0]  # the counters (constants with values) ran
    assert "lerp_" not in seen.ops and "addcdiv_" not in seen.ops
    assert "zeros_like" in seen.ops  # state and gradients are still allocated


def test_real_tensors_take_the_full_step() -> None:
    params = [torch.nn.Parameter(torch.ones(3))]
    optimizer = torch.optim.AdamW(params, lr=0.5, weight_decay=0.1)
    warm_up(optimizer, params)
    # zero gradients: only the decoupled weight decay moves the weights, 1 - 0.5 * 0.1
    assert torch.allclose(params[0].detach(), torch.full((3,), 0.95))


def test_dtensor_parameters_skip_the_same_arithmetic_and_keep_their_shards() -> None:
    """FSDP2 and TP parameters are DTensors over fake local shards: their in-place updates
    are skipped too (a 70B rank run's warm-up went through DTensor's dispatch for each)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    from inspector.distributed.world import fake_world

    fake_mode = new_fake_mode()
    states, seen_ops = [], []
    for skip in (False, True):
        with fake_world(4, 1) as mesh, fake_mode:
            params = [
                torch.nn.Parameter(distribute_tensor(torch.empty(10, 4), mesh, [Shard(0)])),
                torch.nn.Parameter(distribute_tensor(torch.empty(8), mesh, [Shard(0)])),
            ]
            optimizer = make_optimizer("adamw", params)
            for p in params:
                p.grad = torch.zeros_like(p)
            with SeenOps() as seen, skipped_inplace_arithmetic() if skip else nullcontext():
                optimizer.step()
            local = lambda t: getattr(t, "_local_tensor", t)  # noqa: E731
            states.append((_state(optimizer), state_bytes_of(optimizer, local)))
            seen_ops.append(seen.ops)
    assert states[0] == states[1]
    # rank 1 of 4: rows 3..5 of the 10 (chunks of 3) and 2 of the 8: moments of
    # (3 x 4 + 2) float32 values each, and two step scalars
    assert states[1][1] == 2 * (3 * 4 + 2) * 4 + 2 * 4
    assert "lerp_" in seen_ops[0] and "lerp_" not in seen_ops[1]


def _full_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every optimizer step, warm-up and tracked, runs its in-place arithmetic."""
    import inspector.distributed.rankstep as rankstep
    import inspector.memory.step as step

    monkeypatch.setattr(step, "without_inplace_arithmetic", lambda params: nullcontext())
    monkeypatch.setattr(rankstep, "without_inplace_arithmetic", lambda params: nullcontext())


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(24, 40), torch.nn.LayerNorm(40), torch.nn.GELU(), torch.nn.Linear(40, 8)
    )


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw"])
def test_tracked_step_without_the_arithmetic_tracks_the_same_memory(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory pass's fake step skips the optimizer's in-place arithmetic too: its
    peak, phase peaks and timeline are those of the full step, byte for byte."""
    from inspector.context import Inputs
    from inspector.memory.shadow import fake_inputs, fake_shadow
    from inspector.memory.step import StepOptions, train_step

    def run() -> tuple:
        mode = new_fake_mode()
        opts = StepOptions(optimizer=name, fake_mode=mode)
        inputs = fake_inputs(Inputs((torch.randn(16, 24),)), mode)
        r = train_step(fake_shadow(_mlp(), mode), inputs, opts)
        return r.peak_bytes, r.peak_phase, r.phase_peaks, r.points, r.optimizer_bytes

    skipped = run()
    _full_steps(monkeypatch)
    assert run() == skipped
    if name == "adamw":  # by hand: the step's peak is at the largest weight's division
        params = (24 * 40 + 40 + 40 + 40 + 40 * 8 + 8) * 4  # 5,632 B
        state = 2 * params + 6 * 4  # two moments and six step scalars
        inputs, loss = 16 * 24 * 4, 4
        sqrt_and_quotient = 2 * 40 * 24 * 4  # sqrt(exp_avg_sq) and its division, both live
        assert skipped[2]["optimizer"] == 2 * params + state + inputs + loss + sqrt_and_quotient


def test_fsdp_rank_step_without_the_arithmetic_tracks_the_same_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank run's tracked optimizer step over DTensor shards: the same figures."""
    from inspector.context import Inputs
    from inspector.distributed.fsdp import fsdp_rank_memory
    from inspector.memory.shadow import fake_inputs
    from inspector.memory.step import StepOptions
    from inspector.schema.parallel import parse_plan

    def run() -> tuple:
        mode = new_fake_mode()
        opts = StepOptions(fake_mode=mode, loss_fn=lambda out, _: out.sum())
        inputs = fake_inputs(Inputs((torch.randn(16, 24),)), mode)
        m = fsdp_rank_memory(_mlp(), inputs, opts, parse_plan("fsdp:3"), rank=2)
        return m.peak_bytes, m.peak_phase, m.phase_peaks, m.optimizer_bytes

    skipped = run()
    _full_steps(monkeypatch)
    assert run() == skipped


def _state_values(optimizer: torch.optim.Optimizer) -> list[tuple]:
    return [
        (key, tuple(v.shape), v.stride(), v.dtype, v.tolist())
        for state in optimizer.state.values()
        for key, v in sorted(state.items())
    ]


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd", "momentum"])
def test_a_real_warm_up_without_values_leaves_the_full_steps_state(name: str) -> None:
    """On real tensors, zero gradients make the state known: the moments are zeros,
    momentum the clone of a zero gradient, each counter at one step. The same bytes are
    allocated, in the same order (all but the 0-dim tensors the kernels wrap Python
    numbers in), and the arithmetic that does not change the state is not run."""
    from inspector.memory.allocations import allocations_recorded

    runs = []
    for values in (True, False):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(6, 4)), torch.nn.Parameter(torch.randn(4))]
        optimizer = make_optimizer(name, params)
        with allocations_recorded() as events, SeenOps() as seen:
            warm_up(optimizer, params, shorten=False, values=values)
        events_in_order = sorted(_allocation_events(events()), key=lambda e: e.start_time_ns)
        # +/- bytes of the allocations and frees of tensors of 4 values and more
        sizes = [e.extra_fields.alloc_size for e in events_in_order]
        sizes = [n for n in sizes if abs(n) >= 16]
        runs.append((_state_values(optimizer), sizes, seen.ops))
    (full, full_sizes, full_ops), (kept, kept_sizes, kept_ops) = runs
    assert kept == full and kept_sizes == full_sizes
    if name in ("adam", "adamw"):
        # per parameter: two moments and a 0-dim counter, which still counts to one
        assert [k for k, *_ in kept] == ["exp_avg", "exp_avg_sq", "step"] * 2
        assert [v for k, *_, v in kept if k == "step"] == [1.0, 1.0]
        assert "sqrt" in full_ops and "lerp_" in full_ops
        assert not {"sqrt", "div", "lerp_", "addcdiv_", "mul_"} & set(kept_ops)
        assert kept_ops.count("empty_like") == 2 * 2  # the denominator's two temporaries
    if name == "momentum":
        assert "clone" in kept_ops  # the momentum buffer is made as the step makes it


def _allocation_events(roots: list) -> list:
    from torch._C._profiler import _EventType

    found, stack = [], list(roots)
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation:
            found.append(event)
    return found


def test_the_measured_step_measures_the_same_bytes_after_either_warm_up(monkeypatch) -> None:
    """The measured step's ground truth is what it was with the full warm-up."""
    from inspector.context import Inputs
    from inspector.memory import measure as measure_module
    from inspector.memory.step import StepOptions

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    inputs = Inputs((torch.randn(16, 64),), {})
    full_warm_up = lambda *a, **k: warm_up(*a, **{**k, "values": True})  # noqa: E731
    got = []
    for patched in (False, True):
        if patched:
            monkeypatch.setattr(measure_module, "warm_up", full_warm_up)
        m = measure_module.measure(model, inputs, StepOptions(optimizer="adamw"))
        got.append((m.forward_peak_bytes, m.saved_activation_bytes, m.train_peak_bytes))
    assert got[0] == got[1]
    params = 64 * 128 + 128 + 128 * 8 + 8
    # the step peaks with weights, two moments and gradients resident, at least
    assert got[0][2] >= 4 * params * 4
