"""One instrumented forward and the loss, for the rules that need to see inside them:
which op made each loss function's input (health/lossops.py, `ctx.results.loss_calls`)
the parameters or modules created while forward runs (health/created.py,
`ctx.results.created_in_forward`) and the tensors forward puts on a fixed device
(health/devices.py, `ctx.results.fixed_devices`), and attention-like softmaxes
(health/attention.py, `ctx.results.attention_softmaxes`).

Only the attention softmaxes' saturation needs values: a real model's forward runs on a
fake copy first where a fake step is cheaper than a real one (inspector/realcost.py: the
memory pass's fake step against the load's real forward; the time of its Python, not of
its arithmetic), and for real when that copy cannot run it (`.item()` deciding a branch)
or finds an attention softmax. Where the captured graph shows a softmax and a matmul
among its calls (what an attention softmax is made of), the copy is not made: it would
most likely find one, and the real forward would follow it; the findings are the same
either way (EfficientFormer-L1: its probe 0.26 s -> 0.12 s, in its lane).

It reads only the model, the inputs and those timings (before the memory pass, the graph
pass's), so it runs beside the other passes from the graph pass on (inspector/beside.py):
on ResNet-18's line it was the last pass to run the model, a fork and 0.06 s after the
gradients pass."""

from __future__ import annotations

from contextlib import nullcontext, suppress
from dataclasses import dataclass, field
from typing import Any

import torch

from inspector.context import Context, Inputs
from inspector.health.attention import MATMULS, AttentionRecorder, AttentionSoftmax
from inspector.health.created import Created, creations
from inspector.health.devices import DeviceRecorder, FixedDevice
from inspector.health.lossops import LossCall, LossRecorder
from inspector.health.state import preserved
from inspector.memory.loss import DefaultLossRefused, compute_loss
from inspector.memory.rough import step_bytes
from inspector.memory.shadow import fake_inputs, fake_shadow, new_fake_mode
from inspector.realcost import fake_step_is_cheaper

__all__ = ["run", "compute", "apply", "needs", "Found"]

_fake_is_cheaper = fake_step_is_cheaper  # a name of this module's: tests replace it

# The softmax of an attention softmax (its matmuls: inspector/health/attention.py), as
# parts of a graph node's dotted target: `softmax`, `torch.softmax`, `aten._softmax.default`.
_SOFTMAXES = frozenset({"softmax", "_softmax"})


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


@dataclass
class Found:
    """What the probe found, for the rules (picklable: it may come from a lane)."""

    loss_calls: list[LossCall]
    created: list[Created]
    fixed_devices: list[FixedDevice]
    attention_softmaxes: list[AttentionSoftmax]


def run(ctx: Context) -> None:
    apply(ctx, compute(ctx))


def compute(ctx: Context) -> Found:
    """The probe's findings; the report and results untouched."""
    fake_first = ctx.fake_mode is None and _fake_is_cheaper(ctx) and not _attention_in_graph(ctx)
    probe = _on_fake_copy(ctx) if fake_first else None
    if probe is None:
        probe = _Probe(ctx.loaded.user_files)
        # what ran before a failure is kept; the gradients pass reports the failure
        with suppress(Exception):
            probe.run(ctx.model, ctx.inputs, ctx, ctx.fake_mode)
    return Found(
        probe.loss.calls,
        probe.created,
        list(probe.devices.found.values()),
        list(probe.attention.found.values()),
    )


def apply(ctx: Context, found: Found) -> None:
    ctx.results.loss_calls = found.loss_calls
    ctx.results.created_in_forward = found.created
    ctx.results.fixed_devices = found.fixed_devices
    ctx.results.attention_softmaxes = found.attention_softmaxes


def needs(ctx: Context) -> int | None:
    """Bytes the probe takes at most: one forward under no_grad, an inference forward's
    peak (on a fake copy nothing real, but it may fall back to the real forward); on
    fake tensors nothing real at all."""
    if ctx.fake_mode is not None:
        return 0
    known = step_bytes(ctx)
    return None if known is None else known.forward_peak


def _attention_in_graph(ctx: Context) -> bool:
    """Whether the captured graph calls a softmax and a matmul: a fake copy's forward
    would most likely find an attention softmax there, whose saturation needs the real
    one. A graph of module calls, or none, says nothing (False): the copy decides."""
    called: set[str] = set()
    for node in ctx.report.nodes:
        if node.op in ("call_function", "call_method"):
            called.update(node.target.split("."))
    return not called.isdisjoint(_SOFTMAXES) and not called.isdisjoint(MATMULS)


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
