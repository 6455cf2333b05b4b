"""torch.compile readiness (`report.compile`): Dynamo's graphs and graph breaks on the
sample, with the user's line of each break, and the recompilations each named dim causes
when it changes. Graphs run eagerly (no Inductor), Dynamo reset after.

Fake mode works: Dynamo traces with the inputs' own FakeTensorMode, so a model built on
fake tensors is checked without allocating it (its graphs and breaks are those of the real
model). A break on a tensor's value (`.item()`, `.tolist()`) is found, but the Python that
runs after it has no value to go on with: the check stops there and says so.
"""

from __future__ import annotations

import re
import time
from contextlib import nullcontext

import torch
from torch.utils._pytree import tree_map

from inspector.compiling.breaks import graph_breaks
from inspector.compiling.dynamo import Checked, GuardFailure, check
from inspector.context import Context, Inputs
from inspector.graph.symdims import perturbed_value
from inspector.health.state import preserved
from inspector.report import Compile, Recompile

__all__ = ["run"]


def run(ctx: Context) -> None:
    """Fill `report.compile`."""
    start = time.perf_counter()
    ctx.report.compile = section = Compile(mode="train" if ctx.model.training else "eval")
    if ctx.options.compile == "none":
        section.skipped = "not asked for (--compile none)"
        return
    if ctx.loaded.source_kind == "torchscript":
        section.skipped = "a TorchScript model is not compiled with torch.compile"
        return
    with preserved(ctx.model), ctx.fake_mode or nullcontext():
        moved = {name: perturbed_value(value) for name, value in ctx.inputs.dims.items()}
        try:
            count_all = ctx.options.compile == "all"
            base = _unmarked(ctx.inputs)
            out = check(ctx.model, base, _changed(ctx, moved), count_all=count_all)
        except Exception as exc:  # noqa: BLE001 - Dynamo failing on the model is the answer
            section.error = _first_line(exc)
        else:
            _fill(section, out, ctx, moved)
    section.seconds = round(time.perf_counter() - start, 3)


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
