"""One instrumented forward and the loss, for the rules that need to see inside them:
which op made each loss function's input (health/lossops.py, `ctx.results.loss_calls`)
the parameters or modules created while forward runs (health/created.py,
`ctx.results.created_in_forward`) and the tensors forward puts on a fixed device
(health/devices.py, `ctx.results.fixed_devices`), and attention-like softmaxes
(health/attention.py, `ctx.results.attention_softmaxes`)."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from inspector.context import Context
from inspector.health.attention import AttentionRecorder
from inspector.health.created import creations
from inspector.health.devices import DeviceRecorder
from inspector.health.lossops import LossRecorder
from inspector.health.state import preserved
from inspector.memory.loss import compute_loss

__all__ = ["run"]


def run(ctx: Context) -> None:
    recorder = LossRecorder(ctx.loaded.user_files)
    devices = DeviceRecorder(ctx.loaded.user_files)
    attention = AttentionRecorder(ctx.loaded.user_files)
    created = []
    try:
        with preserved(ctx.model), ctx.fake_mode or nullcontext(), torch.no_grad():
            with creations(ctx.loaded.user_files) as created, recorder, devices, attention:
                output = ctx.inputs.call(ctx.model)
            with recorder:
                compute_loss(ctx.loaded.loss_fn, output, ctx.inputs)
    except Exception:  # noqa: BLE001 - the gradients pass reports a failing forward or loss
        pass
    ctx.results.loss_calls = recorder.calls
    ctx.results.created_in_forward = created
    ctx.results.fixed_devices = list(devices.found.values())
    ctx.results.attention_softmaxes = list(attention.found.values())
