"""A candidate's training-step peak, predicted from the memory pass's pieces (no run).

  forward/backward peak(m) = fixed + per_sample * m (the measured batch line), with
  - bf16 autocast or bf16 parameters: the batch-dependent part times the measured bf16
    ratio;
  - bf16 parameters: parameters, gradients and (Adam, momentum) state at half;
  - another optimizer: its state instead of the current one's;
  - checkpointed blocks: their savings freed (scaled to the micro-batch and dtype), less
    the largest of them, which its recompute brings back during backward;
  - accumulation: the gradients of the earlier micro-steps resident throughout;
  optimizer-step peak = parameters + buffers + inputs + gradients + state + temporaries;
  peak = the larger of the two.
Under FSDP (`sharded_peak`) a candidate is predicted from a run at the same ranks of
another (the max-saving plan): the forward peak moves by what does not shard (the
activations, scaled with the micro-batch and dtype, less the checkpointing's relief) as
it does on one GPU, the backward peak by the blocks' share still held where it happened
(none at the root's embedding, backward's last op); the optimizer step's peak and the
sharded parameters, gradients and state stay; accumulation holds the rank's gradient
shards, not every gradient. The gathering dtype is not predicted (float32 units are
twice bf16's): a run with it is the reference.
The prediction only orders the candidates; `verify` runs the one chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

from inspector.fitplan.candidate import Candidate
from inspector.fitplan.pieces import Pieces

__all__ = [
    "predict_peak",
    "activation_scale",
    "fb_without_checkpoint",
    "checkpoint_relief",
    "selective_share",
    "optimizer_peak",
    "sharded_peak",
    "Phases",
]


def activation_scale(p: Pieces, c: Candidate) -> float:
    """How the batch-dependent bytes scale: micro-batch over the input's batch, times the
    bf16 ratio when the activations become bf16."""
    scale = (c.micro_batch / p.batch) if (p.batch and c.micro_batch) else 1.0
    if (c.autocast or c.bf16_params) and p.bf16_ratio is not None:
        scale *= p.bf16_ratio
    return scale


def _statics(p: Pieces, c: Candidate) -> tuple[float, float, float]:
    """(parameters, gradients, optimizer state) bytes under the candidate."""
    half = 0.5 if c.bf16_params else 1.0
    state = p.state.get(c.optimizer, (0, 0))[0]
    return p.param_bytes * half, p.grad_bytes * half, state * half


def fb_without_checkpoint(p: Pieces, c: Candidate) -> float:
    """The forward/backward peak before any checkpointing."""
    params, grads, state = _statics(p, c)
    current_state = p.state.get(p.optimizer, (0, 0))[0]
    m = c.micro_batch or p.batch or 0
    batch_part = p.per_sample_bytes * m
    if (c.autocast or c.bf16_params) and p.bf16_ratio is not None:
        batch_part *= p.bf16_ratio
    fixed = p.fixed_bytes - (p.param_bytes - params) - (p.grad_bytes - grads)
    fixed += state - current_state
    if not p.per_sample_bytes:  # no batch line: the measured peak above the static, scaled
        fixed = (fixed - _static(p)) * activation_scale(p, c) + _static(p)
    accumulated = grads if c.accumulation > 1 else 0.0
    return fixed + batch_part + accumulated


def _static(p: Pieces) -> float:
    return p.param_bytes + p.buffer_bytes + p.input_bytes + p.grad_bytes


def selective_share(p: Pieces, c: Candidate) -> float:
    """Selective checkpointing's saving per block (its measured total, evenly), scaled."""
    count = len(p.block_paths)
    return p.selective_saving_bytes / count * activation_scale(p, c) if count else 0.0


def checkpoint_relief(p: Pieces, c: Candidate) -> float:
    """Bytes the candidate's checkpointing takes off the forward/backward peak: the fully
    checkpointed blocks' savings less the largest (recomputed at once in backward), and
    the selective share of each other block."""
    savings = [b.saving_bytes for b in p.blocks if b.path in c.checkpoint]
    full = (sum(savings) - max(savings)) * activation_scale(p, c) if savings else 0.0
    others = len([path for path in p.block_paths if path not in c.checkpoint])
    return full + (selective_share(p, c) * others if c.selective else 0.0)


def optimizer_peak(p: Pieces, c: Candidate) -> float:
    params, grads, state = _statics(p, c)
    temporaries = p.state.get(c.optimizer, (0, 0))[1] * (0.5 if c.bf16_params else 1.0)
    inputs = p.input_bytes * ((c.micro_batch / p.batch) if (p.batch and c.micro_batch) else 1)
    return params + p.buffer_bytes + inputs + grads + state + temporaries


def predict_peak(p: Pieces, c: Candidate) -> int:
    fb = fb_without_checkpoint(p, c) - checkpoint_relief(p, c)
    return round(max(fb, optimizer_peak(p, c)))


@dataclass(frozen=True)
class Phases:
    """A rank's peak in each phase of a run (the gradient shards accumulation holds not
    added) and what ran at the backward one: what a sharded prediction starts from."""

    forward_bytes: int
    backward_bytes: int
    optimizer_bytes: int
    backward_label: str | None


def _activations(p: Pieces, c: Candidate) -> float:
    """The part of the forward/backward peak that does not shard, as one GPU's prediction
    has it: the activations with the candidate's checkpointing (one GPU's accumulated
    gradients left out: a rank holds its shards, added apart)."""
    one_gpu_held = _statics(p, c)[1] if c.accumulation > 1 else 0.0
    return fb_without_checkpoint(p, c) - one_gpu_held - checkpoint_relief(p, c)


def _block_activations(p: Pieces, c: Candidate, path: str) -> float:
    saving = next((b.saving_bytes for b in p.blocks if b.path == path), 0)
    return 0.0 if path in c.checkpoint else saving * activation_scale(p, c)


def _behind(p: Pieces, c: Candidate, ref: Candidate, label: str | None, moved: float) -> float:
    """Of `moved`, what is still held at `ref`'s backward peak (at `label`): the blocks
    backward has not reached yet (up to the label's, in model order); none of them at a
    module before the first block (an embedding: backward's last op); all of `moved`
    after the last block or where unknown."""
    if label is None:
        return moved
    if label in p.before_blocks:
        held: list[str] = []
    else:
        inside = [i for i, b in enumerate(p.block_paths) if label == b or label.startswith(b + ".")]
        if not inside:
            return moved
        held = p.block_paths[: inside[0] + 1]
    return sum(_block_activations(p, c, b) - _block_activations(p, ref, b) for b in held)


def sharded_peak(p: Pieces, c: Candidate, ref: Candidate, run: Phases, rank_grads: int) -> int:
    """`c`'s heaviest FSDP rank from `ref`'s run at the same ranks, optimizer and gathering
    dtype: its forward peak moved by the activations, its backward peak by those still
    held there, its optimizer-step peak as it was, and the rank's gradient shards
    `rank_grads` held when accumulating."""
    moved = _activations(p, c) - _activations(p, ref)
    behind = _behind(p, c, ref, run.backward_label, moved)
    held = rank_grads if c.accumulation > 1 else 0
    fb = max(run.forward_bytes + moved, run.backward_bytes + behind)
    return round(max(fb, run.optimizer_bytes) + held)
