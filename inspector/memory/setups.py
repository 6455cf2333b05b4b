"""Training set-ups side by side: the same model under other optimizers, activation
dtypes and activation checkpointing.

Built from what the memory pass measured, not guessed: the chosen set-up's training step,
the bf16-autocast re-run, the checkpointing saving of every block, and, per optimizer,
one fake `step()` over tensors shaped like the parameters (its state and temporaries).
- Optimizer state is resident for the whole step (allocated at the first step), so
  another optimizer moves the forward/backward peak by the difference in state bytes,
  and the optimizer phase peaks at resident + gradients + state + the step's temporaries.
- Autocast takes the re-run's activations.
- Checkpointing every block: the step run that way on fake tensors (the memory pass's
  check of its advice); without that run (a model that only runs on real tensors), only
  the blocks' inputs stay saved and one block's activations come back at the peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inspector.memory.kinds import kind, looped, pairs_walk, state_bytes
from inspector.memory.optimizer import make_optimizer, state_bytes_of
from inspector.memory.step import warm_up
from inspector.memory.tracker import LiveTracker
from inspector.memory.warmup import without_inplace_arithmetic
from inspector.report import SetupEstimate

__all__ = ["Measured", "setups", "step_costs", "step_cost", "COMPARED_OPTIMIZERS"]

# The optimizers the set-ups table compares side by side (a subset of the schema's choices:
# adam keeps the same state as adamw, none is not a training set-up).
COMPARED_OPTIMIZERS = ("sgd", "momentum", "adamw")


@dataclass(frozen=True)
class Measured:
    """The chosen set-up's figures and the variations the memory pass measured."""

    optimizer: str
    dtype: str  # the activation dtype of the measured step: float32, bf16, fp16
    resident_bytes: int  # parameters + buffers + inputs
    param_bytes: int
    grad_bytes: int
    saved_bytes: int
    fb_peak_bytes: int  # forward/backward peak, the chosen optimizer's state resident
    # optimizer name -> (state bytes, temporaries of one step)
    step: dict[str, tuple[int, int]] = field(default_factory=dict)
    bf16_saved_bytes: int | None = None  # None: no bf16 re-run
    bf16_fb_peak_bytes: int | None = None
    checkpoint_saving_bytes: int = 0  # all blocks checkpointed: saved bytes freed
    largest_block_bytes: int = 0  # recomputed during backward, so it comes back
    # block inputs no op saved (a norm that saves its float32 copy instead): a checkpoint
    # keeps them
    checkpoint_kept_bytes: int = 0
    # measured with every block checkpointed (fake tensors): (saved, forward/backward peak)
    checkpoint_run: tuple[int, int] | None = None


def setups(m: Measured) -> list[SetupEstimate]:
    """Every optimizer x {measured dtype, bf16} x {no checkpointing, every block}."""
    dtypes = [m.dtype] + (["bf16"] if m.bf16_fb_peak_bytes is not None else [])
    names = [n for n in COMPARED_OPTIMIZERS if n in m.step]
    if m.optimizer not in names:
        names.append(m.optimizer)
    rows = []
    for optimizer in names:
        for dtype in dtypes:
            for checkpoint in (False, True):
                if checkpoint and m.checkpoint_saving_bytes <= 0:
                    continue
                rows.append(_row(m, optimizer, dtype, checkpoint))
    return rows


def _row(m: Measured, optimizer: str, dtype: str, checkpoint: bool) -> SetupEstimate:
    state, temporaries = m.step.get(optimizer, (0, 0))
    delta_state = state - m.step.get(m.optimizer, (0, 0))[0]
    if dtype == m.dtype:
        saved, fb = m.saved_bytes, m.fb_peak_bytes
    else:
        saved, fb = m.bf16_saved_bytes or 0, m.bf16_fb_peak_bytes or 0
    if checkpoint and m.checkpoint_run is not None:
        ratio = saved / m.saved_bytes if m.saved_bytes else 1.0  # bf16 halves the blocks too
        run_saved, run_fb = m.checkpoint_run
        saved -= round((m.saved_bytes - run_saved) * ratio)
        fb -= round((m.fb_peak_bytes - run_fb) * ratio)
    elif checkpoint:
        ratio = saved / m.saved_bytes if m.saved_bytes else 1.0  # bf16 halves the blocks too
        kept = m.checkpoint_kept_bytes * ratio
        saved -= round(m.checkpoint_saving_bytes * ratio - kept)
        fb -= round((m.checkpoint_saving_bytes - m.largest_block_bytes) * ratio - kept)
    step_peak = m.resident_bytes + m.grad_bytes + state + temporaries if optimizer != "none" else 0
    return SetupEstimate(
        optimizer=optimizer,
        activation_dtype=dtype,
        checkpointing=checkpoint,
        measured=(optimizer == m.optimizer and dtype == m.dtype and not checkpoint),
        param_bytes=m.param_bytes,
        grad_bytes=m.grad_bytes,
        optimizer_bytes=state,
        saved_activation_bytes=max(saved, 0),
        train_peak_bytes=max(fb + delta_state, step_peak),
    )


def step_costs(
    params: list[torch.Tensor], names: list[str], fake_mode: object
) -> dict[str, tuple[int, int]]:
    """Per optimizer: (state bytes, bytes its `step()` allocates on top), from one fake
    step over tensors shaped like `params` with gradients: no weights needed."""
    return {name: step_cost(name, params, fake_mode) for name in names}


def step_cost(
    name: str, params: list[torch.Tensor], fake_mode: object, shorten: bool = True
) -> tuple[int, int]:
    """(state bytes, temporaries) of one `step()` of optimizer `name` over `params`.

    `shorten`: the step runs over the parameters that decide its bytes and the state of
    the rest is added by kind (inspector/memory/kinds.py)."""
    kinds = [kind(p) for p in params]
    chosen = pairs_walk(kinds) if shorten else list(range(len(params)))
    with fake_mode:
        shadows = dict(zip(chosen, _shadows([params[i] for i in chosen]), strict=True))
        if len(chosen) < len(params) and not looped(list(shadows.values())):  # batched: all
            others = [i for i in range(len(params)) if i not in shadows]
            shadows.update(zip(others, _shadows([params[i] for i in others]), strict=True))
            chosen = list(range(len(params)))
        run = [shadows[i] for i in chosen]
        optimizer = make_optimizer(name, run)
        if optimizer is None:
            return 0, 0
        warm_up(optimizer, run, shorten=shorten)
        for p in run:
            p.grad = torch.empty_like(p)
        tracker = LiveTracker()
        tracker.add_all(run, "static")
        tracker.add_all([p.grad for p in run], "static")
        for state in optimizer.state.values():
            tracker.add_all(list(state.values()), "static")
        resident = tracker.live
        with tracker, without_inplace_arithmetic(run):
            optimizer.step()
        state_of_kind = {
            kinds[i]: state_bytes(optimizer, p) for i, p in zip(chosen, run, strict=True)
        }
        ran = set(chosen)
        rest = sum(state_of_kind[k] for i, k in enumerate(kinds) if i not in ran)
        return state_bytes_of(optimizer) + rest, tracker.peak - resident


def _shadows(params: list[torch.Tensor]) -> list[torch.nn.Parameter]:
    return [
        torch.nn.Parameter(torch.empty_like(p, device=p.device), requires_grad=True) for p in params
    ]
