"""Modules the graph has no node for: measured with hooks.

fx keeps torch.nn's own modules whole (`nn.TransformerEncoder`, `nn.MultiheadAttention`),
and any module whose tracing fails: the graph has one `call_module` node for it, and the
modules inside get no shapes or FLOPs. torch.export inlines every module, so one that runs
no op (`nn.Identity`: RAFT's downsample branches) leaves no node at all. One
hooks-recorded forward of the model on meta tensors (nothing allocated; on the main run's
fake or real tensors when meta cannot stand in) fills them in: calls, input and output
shapes and dtypes, FLOPs and output bytes. The named dims come from a second run with each
dim changed: an entry that changes with it is that dim.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext
from typing import Any

from inspector.context import Context, Inputs
from inspector.graph.hooks import record_hooks
from inspector.graph.metarun import run_on_meta, to_meta
from inspector.graph.records import NodeRecord
from inspector.graph.runner import preserved_state
from inspector.report import Module, Shape, TensorInfo

__all__ = ["fill_leaf_insides"]

# Containers with no forward of their own: never called, nothing to fill.
_NO_FORWARD = frozenset({"ModuleList", "ModuleDict", "ParameterList", "ParameterDict"})


def fill_leaf_insides(ctx: Context, modules: list[Module]) -> None:
    """Give the modules the graph saw no call of the measures it could not; those the
    hooks see not running either (a branch not taken) stay blank."""
    if ctx.capture is None or ctx.capture.method == "hooks":
        return
    blank = [m for m in modules if not m.calls and m.type not in _NO_FORWARD]
    if not blank:
        return
    try:
        base = _by_path(_records(ctx, ctx.inputs))
        names = _dim_names(ctx, base, {m.path for m in blank})
    except Exception as exc:  # an extra measure: the model's own failure is reported elsewhere
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        ctx.report.meta.warnings.append(
            f"modules inside those the graph kept whole were not measured: "
            f"{type(exc).__name__}: {first}"
        )
        return
    for module in blank:
        calls = base.get(module.path)
        if not calls:
            continue  # it did not run (a branch not taken): no shapes to give
        first = calls[0]
        module.calls = len(calls)
        module.input_shapes = _shapes(first.in_tensors, names.get((module.path, "in")))
        module.output_shapes = _shapes(first.out_tensors, names.get((module.path, "out")))
        module.output_dtypes = [t.dtype for t in first.out_tensors]
        module.output_bytes = sum(r.output_bytes for r in calls)
        module.flops_forward = sum(
            r.flops for path, recs in base.items() if _within(path, module.path) for r in recs
        )


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + ".")


def _by_path(records: list[NodeRecord]) -> dict[str, list[NodeRecord]]:
    out: dict[str, list[NodeRecord]] = defaultdict(list)
    for record in records:
        out[record.module_path or ""].append(record)
    return out


def _records(ctx: Context, inputs: Inputs) -> list[NodeRecord]:
    """One forward with a hook on every module: on meta copies, else as the main run."""
    model, files = ctx.model, ctx.loaded.user_files
    try:
        args, kwargs = to_meta((inputs.args, inputs.kwargs))
        call = lambda: model(*args, **kwargs)  # noqa: E731
        return run_on_meta(model, lambda: record_hooks(model, call, user_files=files))
    except Exception:  # the model reads values or mixes devices: run it as the graph ran
        with preserved_state(model, real=ctx.fake_mode is None), ctx.fake_mode or nullcontext():
            return record_hooks(model, lambda: inputs.call(model), user_files=files)


def _dim_names(
    ctx: Context, base: dict[str, list[NodeRecord]], paths: set[str]
) -> dict[tuple[str, str], list[list[str | None]]]:
    """(path, "in"/"out") -> per tensor, per axis: the named dim it is, or None."""
    named: dict[tuple[str, str], list[list[str | None]]] = {}
    for dim, value in ctx.inputs.dims.items():
        with ctx.fake_mode or nullcontext():
            other = ctx.factory.build({**ctx.inputs.dims, dim: value + 1}, ctx.options.device)
        changed = _by_path(_records(ctx, other))
        for path in paths:
            if base.get(path) and changed.get(path):
                for side in ("in", "out"):
                    _mark(named, (path, side), dim, *_sides(base[path][0], changed[path][0], side))
    return named


def _sides(a: NodeRecord, b: NodeRecord, side: str) -> tuple[list[TensorInfo], list[TensorInfo]]:
    return (a.in_tensors, b.in_tensors) if side == "in" else (a.out_tensors, b.out_tensors)


def _mark(
    named: dict[tuple[str, str], list[list[str | None]]],
    key: tuple[str, str],
    dim: str,
    base: list[TensorInfo],
    changed: list[TensorInfo],
) -> None:
    axes = named.setdefault(key, [[None] * len(t.shape) for t in base])
    for i, (t, u) in enumerate(zip(base, changed, strict=False)):
        if len(t.shape) != len(u.shape):
            continue
        for axis, (x, y) in enumerate(zip(t.shape, u.shape, strict=True)):
            if x != y and axes[i][axis] is None:
                axes[i][axis] = dim


def _shapes(tensors: list[TensorInfo], names: Any) -> list[Shape]:
    out = []
    for i, t in enumerate(tensors):
        axes = names[i] if names and i < len(names) else [None] * len(t.shape)
        out.append([n if n is not None else d for d, n in zip(t.shape, axes, strict=False)])
    return out
