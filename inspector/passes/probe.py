"""One instrumented forward and the loss, for the rules that need to see inside them:
which op made each loss function's input (health/lossops.py, `ctx.results.loss_calls`)
the parameters or modules created while forward runs (health/created.py,
`ctx.results.created_in_forward`) and the tensors forward puts on a fixed device
(health/devices.py, `ctx.results.fixed_devices`), and attention-like softmaxes
(health/attention.py, `ctx.results.attention_softmaxes`).

Only the attention softmaxes' saturation needs values: a real model's forward runs on a
fake copy first where a fake step was cheaper than a real one in the memory pass (the
time of its Python, not of its arithmetic), and for real when that copy cannot run it
(`.item()` deciding a branch) or finds an attention softmax."""

from __future__ import annotations

from contextlib import nullcontext, suppress
from dataclasses import dataclass, field
from typing import Any

import torch

from inspector.context import Context, Inputs
from inspector.health.attention import AttentionRecorder
from inspector.health.created import creations
from inspector.health.devices import DeviceRecorder
from inspector.health.lossops import LossRecorder
from inspector.health.state import preserved
from inspector.memory.loss import DefaultLossRefused, compute_loss
from inspector.memory.shadow import fake_inputs, fake_shadow, new_fake_mode

__all__ = ["run"]


@dataclass
class _Probe:
    """The recorders of one forward and its loss."""

    user_files: list[str]
    loss: LossRecorder = field(init=False)
    devices: DeviceRecorder = field(init=False)
    attention: AttentionRecorder = field(init=False)
    created: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.loss = LossRecorder(self.user_files)
        self.devices = DeviceRecorder(self.user_files)
        self.attention = AttentionRecorder(self.user_files)

    def run(self, model: torch.nn.Module, inputs: Inputs, ctx: Context, mode: Any) -> None:
        """Raises what the forward raises, and what a user's loss_fn raises; the default
        loss's own refusal (no output that requires grad, as under no_grad) is kept, as
        it is the same on fake and real tensors."""
        files = self.user_files
        with preserved(model), mode or nullcontext(), torch.no_grad():
            with creations(files) as self.created, self.loss, self.devices, self.attention:
                output = inputs.call(model)
            with self.loss, suppress(DefaultLossRefused):
                compute_loss(ctx.loaded.loss_fn, output, inputs)


def run(ctx: Context) -> None:
    probe = _on_fake_copy(ctx) if ctx.fake_mode is None and _fake_is_cheaper(ctx) else None
    if probe is None:
        probe = _Probe(ctx.loaded.user_files)
        # what ran before a failure is kept; the gradients pass reports the failure
        with suppress(Exception):
            probe.run(ctx.model, ctx.inputs, ctx, ctx.fake_mode)
    ctx.results.loss_calls = probe.loss.calls
    ctx.results.created_in_forward = probe.created
    ctx.results.fixed_devices = list(probe.devices.found.values())
    ctx.results.attention_softmaxes = list(probe.attention.found.values())


def _fake_is_cheaper(ctx: Context) -> bool:
    """Whether the memory pass's fake training step took less than its real one: a
    fake forward costs its Python, a real one its arithmetic (a 1,000-layer MLP of width
    32: 1.3 s fake against 0.07 s real; ResNet-18 at batch 8: the other way round)."""
    measured, analysis = ctx.results.memory_measured, ctx.results.memory
    if measured is None or analysis is None or not analysis.on_fake:
        return False
    return analysis.step_seconds < measured.step_seconds


def _on_fake_copy(ctx: Context) -> _Probe | None:
    """The probe on a fake copy of the real model and inputs; None when the forward or
    the loss needs values there."""
    mode = new_fake_mode()
    probe = _Probe(ctx.loaded.user_files)
    try:
        model = fake_shadow(ctx.model, mode)
        probe.run(model, fake_inputs(ctx.inputs, mode), ctx, mode)
    except Exception:  # noqa: BLE001 - the real forward gives the answer instead
        return None
    if probe.attention.found:  # how saturated an attention softmax is needs its values
        return None
    return probe
