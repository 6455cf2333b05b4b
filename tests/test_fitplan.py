"""`--fit BUDGET`: the search's pieces by hand, its plans against an independent real run,
the "no plan" answer, and the option's errors through the CLI and the API."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from inspector.analyze import inspect_model
from inspector.context import Inputs, Options
from inspector.fitplan.changes import paths_expression
from inspector.fitplan.knapsack import cheapest_cover
from inspector.memory.measure import measure
from inspector.memory.shadow import fake_inputs, fake_shadow, new_fake_mode
from inspector.memory.step import StepOptions, train_step
from inspector.schema.options import OptionError, fit_batch, fit_budget

HERE = Path(__file__).resolve()
MIB = 1024**2
# batch 1 in float64: no micro-batch to split and no bf16 candidates, so a plan is
# checkpointing (or, at a higher risk, a lighter optimizer) only
LONG = '{"x": {"shape": [1, 2048, 32], "dtype": "float64"}}'
WIDE = '{"x": {"shape": ["B", 32]}, "dims": {"B": 512}}'
WIDE64 = '{"x": {"shape": ["B", 32], "dtype": "float64"}, "dims": {"B": 128}}'


class Block(nn.Module):
    def __init__(self, d: int = 32, h: int = 256, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.up, self.act = nn.Linear(d, h, dtype=dtype), nn.GELU()
        self.down = nn.Linear(h, d, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(x)))


class Stack(nn.Module):
    """Six residual MLP blocks; `checkpointed` lists the blocks whose forward runs under
    `torch.utils.checkpoint`, as the fit plan's snippet writes it."""

    def __init__(self, n: int = 6, dtype: torch.dtype = torch.float32, d: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block(d, 8 * d, dtype=dtype) for _ in range(n))
        self.head = nn.Linear(d, 4, dtype=dtype)
        self.checkpointed: set[int] = set()
        self.selective: set[int] = set()  # keep the matmuls' outputs, recompute the rest

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if i in self.checkpointed:
                x = checkpoint(layer, x, use_reentrant=False)
            elif i in self.selective:
                x = checkpoint(layer, x, use_reentrant=False, context_fn=_keep_matmuls)
            else:
                x = layer(x)
        return self.head(x)


def _keep_matmuls() -> tuple[object, object]:
    def policy(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
        keep = op in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Stack64(Stack):
    """In float64 (the real CPU bf16 kernels keep scratch the fake run does not see: 400 KB
    on a 3-D Linear here, an estimate gap of the memory pass's autocast, not of the plan)."""

    def __init__(self) -> None:
        super().__init__(dtype=torch.float64)


class StackWide(Stack):
    """Weights that do not fit one GPU's budget even in bf16 with SGD: 6 blocks of
    2 * 256 * 2048 + 2048 + 256 = 1,050,880 parameters, 25.2 MB in float32."""

    def __init__(self) -> None:
        super().__init__(d=256)


def _fit(spec: str, budget: int, entry: str = "Stack", **options: object) -> object:
    opts = Options(fake=True, passes={"graph", "memory", "fitplan"}, fit_bytes=budget, **options)
    return inspect_model(f"{HERE}:{entry}", spec, opts)


# -- the pieces, by hand ----------------------------------------------------------------


def test_knapsack_takes_the_cheapest_cover() -> None:
    items = [(10, 5), (6, 1), (6, 1)]  # (bytes freed, FLOPs)
    assert cheapest_cover(items, 12) == [1, 2]  # 6 + 6 = 12 for 1 + 1 FLOPs, not 10 + 6 for 6
    assert cheapest_cover(items, 17) == [0, 1, 2]  # 10 + 6 = 16 < 17: all three (22)
    assert cheapest_cover(items, 0) == []
    assert cheapest_cover(items, 23) is None  # 22 bytes at most


def test_paths_as_a_range_when_consecutive() -> None:
    assert paths_expression(["h.0", "h.1", "h.2"]) == '[f"h.{i}" for i in range(0, 3)]'
    assert paths_expression(["h.0", "h.2", "h.3"]) == "['h.0', 'h.2', 'h.3']"


def test_accumulation_holds_the_gradients_through_the_next_forward() -> None:
    """micro_steps=2: the second forward runs with every gradient resident and the first
    loss (4 bytes) still bound, so its peak is the first forward's plus both."""
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    mode = new_fake_mode()
    inputs = fake_inputs(Inputs(args=(torch.randn(16, 32),)), mode)
    one = train_step(fake_shadow(model, mode), inputs, StepOptions(fake_mode=mode))
    two = train_step(fake_shadow(model, mode), inputs, StepOptions(fake_mode=mode, micro_steps=2))
    grads = (32 * 64 + 64 + 64 * 8 + 8) * 4  # 10,784 bytes, one per parameter
    assert two.grad_bytes == one.grad_bytes == grads
    assert two.phase_peaks["forward"] == one.phase_peaks["forward"] + grads + 4


# -- plans against a real run -----------------------------------------------------------


@pytest.fixture(scope="module")
def long_plan() -> object:
    return _fit(LONG, 36 * MIB, entry="Stack64")


def test_checkpointing_plan_fits_and_matches_the_real_step(long_plan: object) -> None:
    """The plan's verified peak against the real step measured by torch.profiler, the
    chosen blocks checkpointed in the model's own forward (the snippet's form)."""
    plan = long_plan.memory.fit_plan
    assert long_plan.memory.train_peak_bytes > 36 * MIB  # it did not fit as it was
    assert plan.found and plan.verified_peak_bytes <= 36 * MIB
    where = {c.kind: c.where for c in plan.changes}
    assert set(where) <= {"checkpoint", "selective-checkpoint"}
    chosen, others = where["checkpoint"], where.get("selective-checkpoint", [])
    assert 1 < len(chosen) < 6  # some blocks, not all: the knapsack stopped when it fit
    model = Stack64()
    model.checkpointed = {int(p.split(".")[1]) for p in chosen}
    model.selective = {int(p.split(".")[1]) for p in others}
    inputs = Inputs(args=(torch.randn(1, 2048, 32, dtype=torch.float64),))
    real = measure(model, inputs, StepOptions(optimizer="adamw"))
    # checkpoint() with preserve_rng_state=True (the snippet's default) keeps the CPU
    # generator's state per block, which the fake run leaves out: 5,056 B at most each
    wrapped = len(chosen) + len(others)
    assert real.train_peak_bytes - 5056 * wrapped <= plan.verified_peak_bytes
    assert plan.verified_peak_bytes <= real.train_peak_bytes * 1.01


def test_checkpointing_plan_counts_its_recompute(long_plan: object) -> None:
    """Non-reentrant checkpointing stops recomputing once backward has what it needs: the
    block's `down` Linear is never rerun, only `up` (2 * 2048 * 32 * 256 FLOPs a block)."""
    plan = long_plan.memory.fit_plan
    blocks = len(next(c for c in plan.changes if c.kind == "checkpoint").where)
    # (selective blocks recompute only element-wise ops: no FLOPs by FlopCounterMode)
    assert plan.recompute_flops == blocks * 2 * 2048 * 32 * 256
    assert 0 < plan.extra_compute < plan.predicted_extra_compute  # the block's whole forward


def test_accumulation_plan_keeps_the_effective_batch() -> None:
    """--batch 512 from inputs at 128: the step at 512 does not fit 8 MiB, micro-batches
    do, with no matmul recomputed (float64: no bf16 candidate is cheaper)."""
    report = _fit(WIDE64, 8 * MIB, entry="Stack64", fit_batch=512)
    plan = report.memory.fit_plan
    assert plan.batch == 512 and plan.baseline_peak_bytes > 8 * MIB
    assert plan.tried[0].summary == "no changes"  # the baseline at 512, run
    assert plan.found and plan.verified_peak_bytes <= 8 * MIB
    kinds = [c.kind for c in plan.changes]  # selective checkpointing: fewer micro-steps
    assert kinds[0] == "accumulate" and set(kinds) <= {"accumulate", "selective-checkpoint"}
    assert plan.micro_batch * plan.accumulation_steps == 512 and plan.accumulation_steps > 1
    assert plan.recompute_flops == 0
    assert plan.tried[-1].fits and plan.tried[-1].verified_peak_bytes == plan.verified_peak_bytes


def test_a_budget_already_met_needs_no_change() -> None:
    report = _fit(WIDE, 1024 * MIB)
    plan = report.memory.fit_plan
    assert plan.found and plan.changes == [] and plan.tried == []
    assert plan.verified_peak_bytes == report.memory.train_peak_bytes


def test_an_impossible_budget_gets_no_plan_and_the_closest() -> None:
    """64 KiB is less than the parameters alone (6 blocks of 16,672 + 132 = 100,164
    parameters, 200 KiB even in bf16): no plan, and the closest run is the smallest."""
    report = _fit(WIDE, 64 * 1024)
    plan = report.memory.fit_plan
    assert not plan.found
    assert any("no plan found" in n for n in plan.notes)
    assert plan.verified_peak_bytes > 64 * 1024
    ran = [t.verified_peak_bytes for t in plan.tried if t.verified_peak_bytes is not None]
    assert plan.verified_peak_bytes == min(ran)
    assert not any(t.fits for t in plan.tried)


@pytest.mark.slow
def test_sharding_when_no_one_gpu_plan_fits() -> None:
    """16 MiB is less than the parameters and gradients alone in bf16 (6,305,280 params
    + the head's 1,028: 2 x 2 B each = 25.2 MB), so one GPU cannot; FSDP can, verified
    at the GPUs it needs and (the distributed planner's check) at one fewer."""
    spec = '{"x": {"shape": ["B", 256]}, "dims": {"B": 8}}'
    plan = _fit(spec, 16 * MIB, entry="StackWide").memory.fit_plan
    assert plan.found and plan.gpus > 1 and plan.verified_peak_bytes <= 16 * MIB
    assert [c.kind for c in plan.changes][0] == "shard"
    fewer = [t for t in plan.tried if t.summary.startswith(f"FSDP on {plan.gpus - 1} GPUs")]
    assert plan.gpus == 2 or (fewer and not fewer[0].fits)
    assert plan.micro_batch * plan.accumulation_steps * plan.gpus >= 8


# -- option errors ----------------------------------------------------------------------


def test_fit_options_parse_and_refuse_clearly() -> None:
    assert fit_budget("24GiB") == 24 * 1024**3 and fit_budget("80GB") == 80 * 10**9
    assert fit_batch("64") == 64
    with pytest.raises(OptionError, match="not a size: 'lots'"):
        fit_budget("lots")
    with pytest.raises(OptionError, match="must be positive"):
        fit_budget("0GB")
    with pytest.raises(OptionError, match="whole number of samples >= 1"):
        fit_batch("0")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fit", "lots"], "fit budget: not a size: 'lots'"),
        (["--fit", "1GiB", "--batch", "two"], "fit batch 'two'"),
        (["--batch", "8"], "--batch is the effective batch of a --fit plan"),
    ],
)
def test_cli_fit_errors(args: list[str], message: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "inspector.cli", "inspect", f"{HERE}:Stack", "--input", WIDE,
         "--fake", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode != 0
    assert message in run.stderr
