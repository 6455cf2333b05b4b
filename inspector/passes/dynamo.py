"""torch.compile readiness (`report.compile`): Dynamo's graphs and graph breaks on the
sample, with the user's line of each break, and the recompilations each named dim causes
when it changes. Graphs run eagerly (no Inductor), Dynamo reset after.

Fake mode works: Dynamo traces with the inputs' own FakeTensorMode, so a model built on
fake tensors is checked without allocating it (its graphs and breaks are those of the real
model). A break on a tensor's value (`.item()`, `.tolist()`) is found, but the Python that
runs after it has no value to go on with: the check stops there and says so.

A real model whose fake training step costs less than its real one (the memory pass timed
the first, the inputs-fit check a real forward) is checked on a fake copy the same way,
which spares its graphs' real forward (GPT-2 small at [4, 512]: 18 s to 3.5 s); where the
copy stops on a value, the model itself is checked. On 48 zoo models both gave the same
graphs, breaks and guards.
"""

from __future__ import annotations

import re
import time
from contextlib import nullcontext
from typing import Any

import torch
from torch.utils._pytree import tree_map

from inspector.compiling.breaks import graph_breaks
from inspector.compiling.dynamo import Checked, GuardFailure, check
from inspector.context import Context, Inputs
from inspector.fakevalues import new_fake_mode
from inspector.graph.symdims import perturbed_value
from inspector.health.state import preserved
from inspector.memory.rough import step_bytes
from inspector.memory.shadow import fake_inputs, fake_shadow
from inspector.realcost import fake_step_is_cheaper
from inspector.report import Compile, Recompile

__all__ = ["run", "compute", "apply", "needs"]

_fake_is_cheaper = fake_step_is_cheaper  # a name of this module's: tests replace it


def run(ctx: Context) -> None:
    """Fill `report.compile`."""
    apply(ctx, compute(ctx))


def compute(ctx: Context) -> Compile:
    """The section, from the model and the memory pass's timings alone (so it can run
    beside the passes after memory: inspector/beside.py)."""
    start = time.perf_counter()
    section = Compile(mode="train" if ctx.model.training else "eval")
    if ctx.options.compile == "none":
        section.skipped = "not asked for (--compile none)"
        return section
    if ctx.loaded.source_kind == "torchscript":
        section.skipped = "a TorchScript model is not compiled with torch.compile"
        return section
    moved = {name: perturbed_value(value) for name, value in ctx.inputs.dims.items()}
    count_all = ctx.options.compile == "all"
    out: Checked | BaseException | None = None
    if ctx.fake_mode is None and _fake_is_cheaper(ctx):
        out = _checked(ctx, moved, count_all, new_fake_mode())
        if not _complete(out):  # values were needed (or fake tensors refused): run for real
            out = None
    if out is None:
        out = _checked(ctx, moved, count_all, ctx.fake_mode)
    if isinstance(out, BaseException):  # Dynamo failing on the model is the answer
        section.error = _first_line(out)
    else:
        _fill(section, out, ctx, moved)
    section.seconds = round(time.perf_counter() - start, 3)
    return section


def needs(ctx: Context) -> int | None:
    """Bytes the check takes at most: the model's graphs run eagerly, forward only, on
    the real inputs: the activations the estimate saves, and its inference forward's
    peak on top. On a fake copy (where that is cheaper) nothing real is allocated but
    the inputs at other dims: an inference forward's peak is room enough."""
    known = step_bytes(ctx)
    if known is None:
        return None
    if ctx.fake_mode is None and _fake_is_cheaper(ctx):
        return known.forward_peak
    return known.saved + known.forward_peak


def apply(ctx: Context, section: Compile) -> None:
    ctx.report.compile = section


def _checked(
    ctx: Context, moved: dict[str, int], count_all: bool, fake_mode: Any
) -> Checked | BaseException:
    """Dynamo on the model (a fake copy under a fake mode it does not run in already)."""
    shadowed = fake_mode is not None and fake_mode is not ctx.fake_mode
    model = fake_shadow(ctx.model, fake_mode) if shadowed else ctx.model
    with preserved(model), fake_mode or nullcontext():
        try:
            base = _unmarked(ctx.inputs)
            base = fake_inputs(base, fake_mode) if shadowed else base
            return check(model, base, _changed(ctx, moved), count_all=count_all)
        except Exception as exc:  # noqa: BLE001 - the caller reports it
            return exc


def _complete(out: Checked | BaseException) -> bool:
    """A fake run that went the whole way: nothing stopped on a tensor's value."""
    if isinstance(out, BaseException) or out.error is not None:
        return False
    return all(error is None for _, error in out.recompiles)


def _unmarked(inputs: Inputs) -> Inputs:
    """The inputs as new tensor objects: torch.export (the capture stage) marks the dims
    it made dynamic on the tensors it was given, and Dynamo would honour those marks."""

    def fresh(value: object) -> object:
        if not isinstance(value, torch.Tensor):
            return value
        copy = value.detach()
        return copy.requires_grad_() if value.requires_grad and copy.is_leaf else copy

    args, kwargs = tree_map(fresh, (tuple(inputs.args), dict(inputs.kwargs)))
    return Inputs(args=args, kwargs=kwargs, dims=dict(inputs.dims))


def _changed(ctx: Context, moved: dict[str, int]) -> list[Inputs]:
    """The inputs with each named dim changed alone."""
    dims = dict(ctx.inputs.dims)
    return [
        ctx.factory.build({**dims, name: value}, device=ctx.options.device)
        for name, value in moved.items()
    ]


def _fill(section: Compile, out: Checked, ctx: Context, moved: dict[str, int]) -> None:
    section.computed = True
    section.graph_count, section.op_count = out.graph_count, out.op_count
    section.graph_break_count = len(out.breaks)
    section.breaks = graph_breaks(out.breaks, ctx.loaded.user_files)
    section.notes = list(out.notes)
    if out.error is not None:  # fake tensors have no values to go on with
        section.error = f"stopped after the last break: {_first_line(out.error)}"
        return
    section.recompiles = [
        Recompile(
            dim=name,
            value=ctx.inputs.dims[name],
            changed_to=moved[name],
            recompiles=len(failures),
            counted=ctx.options.compile == "all",
            guards=_guards(failures),
            error=error,
        )
        for name, (failures, error) in zip(moved, out.recompiles, strict=True)
    ]


_GUARD = re.compile(r"^\d+/\d+: (.+)$")


def _guards(failures: list[GuardFailure]) -> list[str]:
    """ "forward in model.py:12: tensor 'x' size mismatch at index 0. expected 8, actual 4":
    torch's guard lines ("0/0: ..."), without the stack it appends."""
    out = []
    for failure in failures:
        for reason in failure.reasons:
            for line in reason.splitlines():
                guard = _GUARD.match(line.strip().removeprefix("- "))
                if guard:
                    text = guard.group(1).split("  #")[0].strip()
                    out.append(f"{failure.code}: {text}")
    return out


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {(lines[0] if lines else '')[:300]}"
