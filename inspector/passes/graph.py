"""The graph pass: nodes (shapes, params, FLOPs), the module tree, and the totals.

One recording run of the capture, on meta copies of the inputs where the model allows
(shapes and FLOPs need no values; the backward FLOPs come from the same run), else on
the context's inputs (real, or fake under `ctx.fake_mode`); extra runs with each named
dim changed for symbolic dims; a fake forward + backward for the backward FLOPs only when
the meta run could not count them. Parameters come from the model itself, tied ones
counted once.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress

from torch import nn

from inspector.context import Context
from inspector.errors import FakeModeLimit, UserCodeError
from inspector.graph.backward import measure_backward
from inspector.graph.exportcapture import export_graph
from inspector.graph.guidedfx import changed_decision
from inspector.graph.leafinside import fill_leaf_insides
from inspector.graph.metarun import meta_answers_shared
from inspector.graph.modules import build_modules, module_calls
from inspector.graph.params import ParamTable, param_table
from inspector.graph.records import NodeRecord, user_location_from_stack
from inspector.graph.runner import perturb_fake_mode, preserved_state, record_meta, record_run
from inspector.graph.symdims import apply_sym_shapes
from inspector.graph.symmeta import apply_meta_sym_shapes, symbol_names
from inspector.graph.tensors import nbytes
from inspector.realcopy import needs_values
from inspector.report import Node, Totals
from inspector.tracebacks import format_user_traceback, user_location

__all__ = ["run"]


def run(ctx: Context) -> None:
    with meta_answers_shared():  # the meta runs below meet the same kernels
        _run(ctx)


def _run(ctx: Context) -> None:
    records = _main_records(ctx)
    _symbolic(ctx, records)
    types = {p: type(m).__name__ for p, m in ctx.model.named_modules()}
    ctx.report.nodes = [_node(i, r, types) for i, r in enumerate(records)]
    table = param_table(ctx.model)
    bwd_total, bwd = _backward(ctx, records)
    calls = module_calls(records, hooks=ctx.capture is not None and ctx.capture.method == "hooks")
    ctx.report.modules = build_modules(ctx.model, records, calls, table, bwd)
    fill_leaf_insides(ctx, ctx.report.modules)  # modules the graph has no node for
    ctx.report.totals = _totals(ctx.model, table, records, bwd_total)
    if ctx.report.modules:
        ctx.report.modules[0].flops_backward = bwd_total  # the root is the whole model


def _main_records(ctx: Context) -> list[NodeRecord]:
    if ctx.capture is None or ctx.capture.method is None:
        ctx.report.meta.warnings.append(
            "no capture method worked: nodes, shapes and FLOPs are missing (see capture)."
        )
        return []
    cached, ctx.capture.records = ctx.capture.records, None  # taken once: let it go after
    if ctx.capture.method == "hooks" and cached is not None:
        return cached  # capture already ran the model with hooks
    records = _meta_records(ctx)
    if records is not None:
        return records
    try:
        with preserved_state(ctx.model, real=ctx.fake_mode is None):
            return record_run(ctx, ctx.inputs, ctx.fake_mode)
    except Exception as exc:
        records = _static_export_records(ctx) or _eval_mode_records(ctx, exc)
        if records is None:
            raise _run_error(ctx, exc) from exc
        return records


def _meta_records(ctx: Context) -> list[NodeRecord] | None:
    """The main run on meta tensors, counting backward FLOPs too (grad enabled: meta
    keeps nothing); without grad if that fails; None where meta cannot stand in (the
    model reads values, or mixes devices): the caller runs it on the real inputs."""
    for training in (True, False):
        try:
            records = record_meta(ctx, ctx.inputs, training=training)
        except Exception:
            continue
        ran = ctx.results.graph
        ran.on_meta = True
        ran.backward_counted = training and all(r.flops_backward is not None for r in records)
        return records
    return None


def _static_export_records(ctx: Context) -> list[NodeRecord] | None:
    """The graph exported at a named dim of 2 did not run at 1: export at the real dims."""
    cap = ctx.capture
    probed, cap.export_probe = cap.export_probe, False  # one fallback only
    if not probed:
        return None
    try:
        ep, gm = export_graph(
            ctx.model, ctx.inputs.args, ctx.inputs.kwargs, ctx.fake_mode,
            stack_traces=cap.stack_traces,
        )  # fmt: skip
        # the capture is now this static export: its shapes are baked in, so the runs at
        # other dims export again (and match its nodes by name)
        cap.graph_module, cap.exported = gm, ep
        cap.export_dynamic, cap.reexport = False, True
        with preserved_state(ctx.model, real=ctx.fake_mode is None):
            return record_run(ctx, ctx.inputs, ctx.fake_mode)
    except Exception:
        return None


def _eval_mode_records(ctx: Context, exc: Exception) -> list[NodeRecord] | None:
    """A model that fails only in train mode (BatchNorm on one value per channel) still
    has shapes: take them in eval mode; the modes pass reports the failure as a finding."""
    if not ctx.model.training:
        return None
    training = {m: m.training for m in ctx.model.modules()}
    ctx.model.eval()
    try:
        with preserved_state(ctx.model, real=ctx.fake_mode is None):
            records = record_run(ctx, ctx.inputs, ctx.fake_mode)
    except Exception:
        return None
    finally:
        for module, mode in training.items():
            module.training = mode
    first_line = (str(exc).strip().splitlines() or [""])[0][:300]
    ctx.report.meta.warnings.append(
        f"the model fails in train mode ({type(exc).__name__}: {first_line}); "
        "shapes and FLOPs were taken in eval mode."
    )
    return records


def _run_error(ctx: Context, exc: Exception) -> UserCodeError | FakeModeLimit:
    """The captured graph traced, but running it on the inputs failed: the user's code
    or inputs are at fault (a shape mismatch, usually)."""
    files = ctx.loaded.user_files
    where = user_location(exc, files)
    node = getattr(exc, "inspector_where", None)
    if ctx.fake_mode is not None and needs_values(exc):  # torch's limit, not the user's fault
        return FakeModeLimit(
            f"--fake cannot run this model: {getattr(exc, 'func', type(exc).__name__)}"
            + (f" ({node})" if node else "")
            + " has an output size (or a branch) that depends on tensor values, which "
            "fake tensors do not have.",
            hint="Run without --fake on a machine that holds the model.",
            location=where[0] if where else getattr(exc, "inspector_location", None),
        )
    return UserCodeError(
        f"the model raised {type(exc).__name__} while running on the inputs"
        + (f" ({node})" if node else "")
        + f": {str(exc).strip()[:1000]}",
        hint="Check that the input shapes and dtypes fit the model's first layers.",
        location=where[0] if where else getattr(exc, "inspector_location", None),
        user_traceback=format_user_traceback(exc, files),
    )


def _symbolic(ctx: Context, records: list[NodeRecord]) -> None:
    dims = dict(ctx.inputs.dims)
    if not dims or not records:
        return
    if _symbolic_from_export(ctx, records):
        return
    mode = perturb_fake_mode(ctx)
    decisions = ctx.capture.decisions
    specialized: dict[str, str] = {}  # dim -> the decision it changes

    def rerun(dim: str, value: int) -> list[NodeRecord] | None:
        watch = {d.node: None for d in decisions}
        try:
            with mode:
                inputs = ctx.factory.build(dims={**dims, dim: value}, device=ctx.options.device)
            records = None
            if ctx.results.graph.on_meta:
                with suppress(Exception):  # e.g. a static export: run it the fake way
                    records = record_meta(ctx, inputs, main=False, watch=watch)
            if records is None:
                with preserved_state(ctx.model, real=False):
                    records = record_run(
                        ctx, inputs, mode, main=False, count_flops=False, watch=watch
                    )
        except Exception:  # that dim stays concrete; the main run already worked
            return None
        changed = changed_decision(decisions, watch)
        if changed is not None:  # a graph traced at this size would differ
            specialized[dim] = _decided_at(ctx, changed.node)
            return None
        return records

    # a re-exported graph may differ in its node list: match it by node name
    by_name = ctx.capture.method == "export" and ctx.capture.reexport
    failed = apply_sym_shapes(records, dims, rerun, by_name)
    if specialized:
        pinned = ", ".join(f"{d} ({at})" for d, at in specialized.items())
        ctx.report.meta.warnings.append(
            "the traced graph rests on a Python decision (a branch, an int of a size) "
            f"that changes with {pinned}: those dims are shown as plain numbers."
        )
    failed = [d for d in failed if d not in specialized]
    if failed:
        ctx.report.meta.warnings.append(
            f"shapes with {', '.join(failed)} changed did not run: "
            "those dims are shown as plain numbers."
        )


def _decided_at(ctx: Context, node: str) -> str:
    """`node`, and the user's line it was traced at when the trace recorded stacks."""
    found = next((n for n in ctx.capture.graph_module.graph.nodes if n.name == node), None)
    stack = found.meta.get("stack_trace") if found is not None else None
    where = user_location_from_stack(stack, ctx.loaded.user_files)
    return f"`{node}`" + (f" at {where}" if where else "")


def _symbolic_from_export(ctx: Context, records: list[NodeRecord]) -> bool:
    """A symbolic export graph names its sizes itself: no extra runs needed."""
    cap = ctx.capture
    if not cap.export_dynamic:
        return False
    gm, axis_dims = cap.graph_module, cap.axis_dims
    names = symbol_names(gm, axis_dims)
    wanted = {d for axes in axis_dims for d in axes.values()}
    if not names or set(names.values()) != wanted:
        # export kept a dim static (a size of 1 is always specialized): the capture's
        # decision not to re-export is overturned: export again with each dim changed,
        # and match nodes by name
        cap.reexport = True
        return False
    apply_meta_sym_shapes(gm, records, names, list(ctx.inputs.dims))
    return True


def _backward(ctx: Context, records: list[NodeRecord]) -> tuple[int, dict[str, int]]:
    if ctx.results.graph.backward_counted:
        return _by_module(records, lambda r: r.flops_backward or 0)
    try:
        with preserved_state(ctx.model, real=False):
            return measure_backward(ctx.model, ctx.inputs, perturb_fake_mode(ctx))
    except Exception as exc:
        fake_failure = exc
    if ctx.fake_mode is None:
        # A real model whose fake backward fails (an op that needs values: a detector's
        # NMS) is counted on one real forward and backward instead.
        try:
            with preserved_state(ctx.model, real=True):
                return measure_backward(ctx.model, ctx.inputs, None)
        except Exception as exc:
            fake_failure = exc
    ctx.report.meta.warnings.append(
        "backward FLOPs estimated as 2 x forward (a backward could not run: "
        f"{type(fake_failure).__name__}: {str(fake_failure)[:200]})."
    )
    return _by_module(records, lambda r: 2 * r.flops)


def _by_module(
    records: list[NodeRecord], flops: Callable[[NodeRecord], int]
) -> tuple[int, dict[str, int]]:
    """(total, {module path: FLOPs of its nodes and its submodules' nodes})."""
    per_module: dict[str, int] = {}
    for r in records:
        path = r.module_path or ""
        parts = path.split(".") if path else []
        for k in range(len(parts) + 1):
            prefix = ".".join(parts[:k])
            per_module[prefix] = per_module.get(prefix, 0) + flops(r)
    return sum(flops(r) for r in records), per_module


def _node(i: int, r: NodeRecord, types: dict[str, str]) -> Node:
    return Node(
        id=i,
        name=r.name,
        op=r.op,
        target=r.target,
        module_path=r.module_path,
        module_type=types.get(r.module_path) if r.module_path is not None else None,
        inputs=r.inputs,
        input_tensors=r.in_tensors,
        output_tensors=r.out_tensors,
        location=r.location,
        params=r.params,
        flops=r.flops,
        output_bytes=r.output_bytes,
    )


def _totals(
    model: nn.Module, table: ParamTable, records: list[NodeRecord], bwd_total: int
) -> Totals:
    params = list(table.params.values())
    count = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    by_dtype, bytes_by_dtype = table.by_dtype()
    aliased = sum(table.params[c].numel() for c in table.aliases.values())
    return Totals(
        params=count,
        trainable_params=trainable,
        frozen_params=count - trainable,
        tied_params=aliased,
        buffers=sum(b.numel() for b in table.buffers.values()),
        param_bytes=sum(nbytes(p) for p in params),
        buffer_bytes=sum(nbytes(b) for b in table.buffers.values()),
        params_by_dtype=by_dtype,
        param_bytes_by_dtype=bytes_by_dtype,
        flops_forward=sum(r.flops for r in records),
        flops_backward=bwd_total,
        output_bytes=sum(r.output_bytes for r in records),
    )
