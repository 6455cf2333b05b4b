"""`--fit` under FSDP: at the fewest GPUs the max-saving plan (every block checkpointed,
micro-batch 1 per rank) fits on, a cheaper plan that also fits there is the one chosen,
and its verified peak is what a direct FSDP run of that configuration gives."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from inspector.context import Inputs
from inspector.distributed.fsdp import fsdp_heaviest
from inspector.fitplan.candidate import Candidate
from inspector.fitplan.pieces import Block, Pieces
from inspector.fitplan.predict import Phases, sharded_peak
from inspector.memory.shadow import fake_inputs, new_fake_mode
from inspector.memory.step import StepOptions
from inspector.schema.parallel import parse_plan
from tests.test_fitplan import MIB, StackWide, _fit

# StackWide: 6 blocks of 256 -> 2048 -> 256 (6,305,280 parameters + the head's 1,028).
# On one GPU even bf16 parameters and SGD hold 2 + 2 bytes a parameter (25.2 MB) plus the
# activations: its runs peak over 27.3 MB (26 MiB), so FSDP it is, on 8 GPUs
SPEC = '{"x": {"shape": ["B", 32, 256]}, "dims": {"B": 64}}'
SPEC256 = '{"x": {"shape": ["B", 256, 256]}, "dims": {"B": 64}}'
MAX_SAVING = (
    "FSDP on {n} GPUs, bf16 MixedPrecisionPolicy, checkpoint 6 block(s), "
    "micro-batch 1 x {k} accumulation"
)


def test_sharded_prediction_moves_the_activations_only() -> None:
    """By hand: at batch 8, 64 B a sample and two blocks saving 800 B each; checkpointing
    both relieves their savings less the largest (recomputed at once in backward), at
    micro-batch 1: (1600 - 800) / 8 = 100 B."""
    p = Pieces(
        batch=8, optimizer="adamw", param_bytes=4000, buffer_bytes=0, input_bytes=0,
        grad_bytes=4000, saved_bytes=1600, fixed_bytes=9000.0, per_sample_bytes=64.0,
        state={"adamw": (8000, 0)}, blocks=[Block("l.0", "B", 800, 1), Block("l.1", "B", 800, 1)],
        block_paths=["l.0", "l.1"], before_blocks=frozenset({"embed"}),
    )  # fmt: skip
    ref = Candidate("adamw", micro_batch=1, accumulation=8, gpus=4, checkpoint=("l.0", "l.1"))
    two = replace(ref, micro_batch=2, accumulation=4, checkpoint=())
    run = Phases(forward_bytes=1000, backward_bytes=0, optimizer_bytes=0, backward_label=None)
    # activations 9000 + 2 * 64 against 9000 + 64 - 100: moved 164; 7 B of shards held
    assert sharded_peak(p, two, ref, run, 7) == 1000 + 164 + 7
    # an optimizer step peaking higher is not moved by the activations
    assert sharded_peak(p, two, ref, replace(run, optimizer_bytes=5000), 7) == 5000 + 7
    # the whole per-rank batch at once: 8 * 64 - (64 - 100) = 548 moved, nothing held
    eight = replace(ref, micro_batch=8, accumulation=1, checkpoint=())
    assert sharded_peak(p, eight, ref, run, 7) == 1000 + 548
    # a backward peak in block l.0 (l.1 done, its activations gone): only l.0's 800 / 8 *
    # 2 = 200 B more held there; at the embedding (backward's last op), none
    late = Phases(forward_bytes=0, backward_bytes=2000, optimizer_bytes=0, backward_label="l.0.up")
    assert sharded_peak(p, two, ref, late, 7) == 2000 + 200 + 7
    last = replace(late, backward_label="embed")
    assert sharded_peak(p, two, ref, last, 7) == 2000 + 7


def _direct(micro_batch: int, tokens: int, gpus: int, checkpointed: set[int]) -> int:
    """The heaviest rank of the plan's configuration, run directly: a fresh model that
    checkpoints its own blocks in forward (the snippet's form), bf16 gathers, AdamW, and
    (accumulating) the rank's gradient shards held through the next micro-step."""
    mode = new_fake_mode()
    model = StackWide()
    model.checkpointed = checkpointed
    inputs = fake_inputs(Inputs(args=(torch.randn(micro_batch, tokens, 256),)), mode)
    spec = parse_plan(f"fsdp:{gpus},param_dtype=bf16")
    rank = fsdp_heaviest(model, inputs, StepOptions(fake_mode=mode), spec)
    return rank.peak_bytes + rank.grad_bytes


def _max_saving(plan: object, n: int) -> object:
    per_rank = -(-64 // n)  # ceil(B / N) samples a rank
    return next(t for t in plan.tried if t.summary == MAX_SAVING.format(n=n, k=per_rank))


@pytest.mark.slow
def test_a_larger_micro_batch_without_checkpointing_is_chosen() -> None:
    plan = _fit(SPEC, 26 * MIB, entry="StackWide").memory.fit_plan
    assert plan.found and plan.gpus == 8
    assert not any(t.fits for t in plan.tried if not t.summary.startswith("FSDP"))
    assert not any(t.fits for t in plan.tried if t.summary.startswith("FSDP on 7 GPUs"))
    strongest = _max_saving(plan, 8)  # fits at 8 GPUs too, the costlier plan
    assert strongest.fits and strongest.verified_peak_bytes <= 26 * MIB
    # 64 / 8 = 8 samples a rank: micro-batches of 2, 4 of them, no block checkpointed
    assert (plan.micro_batch, plan.accumulation_steps) == (2, 4)
    assert [c.kind for c in plan.changes] == ["shard", "accumulate"]
    assert "Micro-batches of 2 per rank (8 ranks)" in plan.changes[1].summary
    assert "over 4 of them" in plan.changes[1].summary
    assert "8 samples per rank" in plan.changes[0].summary
    assert plan.verified_peak_bytes <= 26 * MIB
    assert plan.verified_peak_bytes == _direct(2, 32, 8, set())
    # the next cheaper step, micro-batches of 4, does not fit: run it directly too
    assert _direct(4, 32, 8, set()) > 26 * MIB
    # no recompute, where the max-saving plan reruns every block's `up` Linear (the
    # non-reentrant recompute stops there): 6 x 2 * 32 * 256 * 2048 FLOPs a micro-step
    assert plan.extra_compute == 0.0
    assert plan.recompute_flops == 0 < 6 * 2 * 32 * 256 * 2048 * 8
    assert plan.tried[-1].verified_peak_bytes == plan.verified_peak_bytes


@pytest.mark.slow
def test_fewer_blocks_checkpointed_are_chosen() -> None:
    """256 tokens a sample, 26 MiB: room at 8 GPUs for some blocks' activations only."""
    plan = _fit(SPEC256, 26 * MIB, entry="StackWide").memory.fit_plan
    assert plan.found and plan.gpus == 8 and plan.micro_batch == 1
    strongest = _max_saving(plan, 8)
    assert strongest.fits
    where = next(c.where for c in plan.changes if c.kind == "checkpoint")
    assert 0 < len(where) < 6
    assert "(after fully_shard, on each rank)" in plan.changes[-1].summary
    blocks = {int(path.split(".")[1]) for path in where}
    assert plan.verified_peak_bytes <= 26 * MIB
    assert plan.verified_peak_bytes == _direct(1, 256, 8, blocks)
    # each checkpointed block reruns its `up` Linear: 2 * 256 * 256 * 2048 FLOPs, 8 times
    assert plan.recompute_flops == len(where) * 2 * 256 * 256 * 2048 * 8
    assert plan.recompute_flops < 6 * 2 * 256 * 256 * 2048 * 8  # the max-saving plan's
