"""The loss's inputs (`ctx.results.loss_calls`): one forward and the loss, recording which
op made each loss function's input (health/lossops.py), for the loss rules."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from inspector.context import Context
from inspector.health.lossops import LossRecorder
from inspector.health.state import preserved
from inspector.memory.loss import compute_loss

__all__ = ["run"]


def run(ctx: Context) -> None:
    recorder = LossRecorder(ctx.loaded.user_files)
    try:
        with preserved(ctx.model), ctx.fake_mode or nullcontext(), torch.no_grad(), recorder:
            output = ctx.inputs.call(ctx.model)
            compute_loss(ctx.loaded.loss_fn, output, ctx.inputs)
    except Exception:  # noqa: BLE001 - the gradients pass reports a failing loss; keep what ran
        pass
    ctx.results.loss_calls = recorder.calls
