"""Rules on gradient flow (the `gradients` section and the backward run's record)."""

from __future__ import annotations

from collections.abc import Iterator

from inspector.context import Context
from inspector.health.backprop import BackwardRun
from inspector.health.cutsite import cut_for
from inspector.health.recorder import CutPoint
from inspector.report import Finding, ParamGrad, Report
from inspector.rules.registry import finding, rule
from inspector.rules.where import node_at

_LIST = 5  # names listed in one message


def _run(ctx: Context) -> BackwardRun | None:
    return ctx.results.gradients


def _by_module(params: list[ParamGrad], verdict: str) -> dict[str, list[ParamGrad]]:
    grouped: dict[str, list[ParamGrad]] = {}
    for row in params:
        if row.verdict == verdict:
            grouped.setdefault(row.module_path, []).append(row)
    return grouped


def _names(rows: list[ParamGrad]) -> str:
    names = [r.name.rpartition(".")[2] for r in rows]
    return ", ".join(names[:_LIST]) + (
        f" and {len(names) - _LIST} more" if len(names) > _LIST else ""
    )


def _cut_fix(cut_at: str) -> str:
    if "no_grad" in cut_at:
        return "Move the computation out of `torch.no_grad()` if these parameters should train."
    if "numpy" in cut_at or "item" in cut_at or "tolist" in cut_at:
        return "Keep the computation in torch: a numpy/Python round trip leaves autograd."
    if "`data`" in cut_at or "`detach" in cut_at:
        return "Remove `.detach()` / `.data` on this path, or freeze the parameters on purpose."
    return "Integer tensors and comparisons carry no gradient: keep the path floating-point."


@rule("grad-path-cut", "error")
def grad_path_cut(ctx: Context, report: Report) -> Iterator[Finding]:
    """Trainable parameters get no gradient because the path to the loss is cut: one
    finding per module cut in forward, one per cut site in loss_fn (at its line)."""
    run = _run(ctx)
    in_loss: dict[str, tuple[CutPoint, list[str]]] = {}  # by site: two detaches on a line
    for module, rows in _by_module(report.gradients.params, "cut").items():
        cut = cut_for(rows[0].name, run.cuts) if run else None
        if cut is not None and cut.in_loss:
            in_loss.setdefault(cut.describe(), (cut, []))[1].append(module or "(root)")
            continue
        yield finding(
            "grad-path-cut",
            module,
            f"{_names(rows)} of module '{module or '(root)'}' get no gradient: the path to "
            f"the loss is cut by {rows[0].cut_at}.",
            _cut_fix(rows[0].cut_at or ""),
        )
    for cut, modules in in_loss.values():
        listed = ", ".join(f"'{m}'" for m in modules[:_LIST])
        more = f" and {len(modules) - _LIST} more" if len(modules) > _LIST else ""
        yield finding(
            "grad-path-cut",
            cut.location or "",
            f"the parameters of {listed}{more} get no gradient: the model's output reaches "
            f"the loss, but the path is cut by {cut.describe()}.",
            _cut_fix(cut.describe()),
        )


@rule("unused-parameter", "warning")
def unused_parameter(ctx: Context, report: Report) -> Iterator[Finding]:
    """Trainable parameters whose module never runs, or whose result never reaches the loss."""
    run = _run(ctx)
    called = set(run.called) if run else set()
    for module, rows in _by_module(report.gradients.params, "unused").items():
        why = (
            "its output never reaches the loss"
            if module in called
            else "the module is never called in forward"
        )
        yield finding(
            "unused-parameter",
            module,
            f"{_names(rows)} of module '{module or '(root)'}' get no gradient: {why}.",
            "Remove the module, or freeze it with requires_grad_(False) if it is kept on "
            "purpose (DDP otherwise needs find_unused_parameters=True).",
        )


@rule("output-without-grad", "error")
def output_without_grad(ctx: Context, report: Report) -> Iterator[Finding]:
    """An output does not require grad although trainable parameters feed it."""
    run = _run(ctx)
    cuts = [c for c in run.cuts if c.params and not c.in_loss] if run else []
    if not cuts:
        return
    for label in run.outputs_without_grad:
        yield finding(
            "output-without-grad",
            label,
            f"{label} does not require grad although trainable parameters feed it: the "
            f"path is cut by {cuts[0].describe()}.",
            _cut_fix(cuts[0].describe()),
        )


def _profile(report: Report, verdict: str) -> tuple[list, float | None]:
    layers = [x for x in report.gradients.layers if x.verdict == verdict]
    rms = [x.grad_rms for x in report.gradients.layers if x.grad_rms is not None]
    return layers, max(rms, default=None)


@rule("vanishing-gradient", "warning")
def vanishing_gradient(ctx: Context, report: Report) -> Iterator[Finding]:
    """Layer gradients (per element) many orders of magnitude below the largest layer's."""
    layers, largest = _profile(report, "vanishing")
    if not layers:
        return
    ratio = report.gradients.thresholds.get("vanishing_ratio")
    listed = ", ".join(f"{x.module_path} ({x.grad_rms or 0.0:.2e})" for x in layers[:_LIST])
    yield finding(
        "vanishing-gradient",
        layers[0].module_path,
        f"{len(layers)} layer(s) get gradients (RMS per element) below {ratio:g} x the "
        f"largest layer's ({largest or 0.0:.2e}): {listed}.",
        "Check the initialisation, add normalisation or residual connections, or use a "
        "non-saturating activation.",
    )


@rule("exploding-gradient", "warning")
def exploding_gradient(ctx: Context, report: Report) -> Iterator[Finding]:
    """Layer gradient norms above the exploding threshold, or gradients that grew on their
    way back to far larger than any later layer's and than the weights."""
    layers, _ = _profile(report, "exploding")
    if not layers:
        return
    th = report.gradients.thresholds
    listed = ", ".join(
        f"{x.module_path} (norm {x.grad_norm:.2e}, grad/weight "
        f"{x.ratio if x.ratio is not None else float('nan'):.2g})"
        for x in layers[:_LIST]
    )
    yield finding(
        "exploding-gradient",
        layers[0].module_path,
        f"{len(layers)} layer(s) have exploding gradients (norm > {th.get('exploding_norm'):g}"
        f", or per element > {th.get('exploding_growth'):g} x every later layer's with "
        f"grad/weight > {th.get('exploding_ratio'):g}): {listed}.",
        "Lower the learning rate, clip gradients (torch.nn.utils.clip_grad_norm_), or fix "
        "the initialisation / loss scale.",
    )


@rule("nan-gradient", "error")
def nan_gradient(ctx: Context, report: Report) -> Iterator[Finding]:
    """NaN/Inf in parameter gradients, with the first node whose output gradient has them."""
    rows = [r for r in report.gradients.params if r.nan_count or r.inf_count]
    if not rows:
        return
    first = report.gradients.first_nan_node
    at = f"; they first appear in the gradient of node '{first}'" if first else ""
    yield finding(
        "nan-gradient",
        first or rows[0].module_path,
        f"{len(rows)} parameter gradient(s) hold NaN/Inf ({_names(rows)}){at}.",
        "Look at the backward of the ops that read that node: sqrt/log/div at 0, pow of "
        "negatives, or overflowing values; guard them with an epsilon or clamp.",
    )


@rule("inplace-autograd", "error")
def inplace_autograd(ctx: Context, report: Report) -> Iterator[Finding]:
    """An in-place op overwrote a tensor that autograd saved: backward fails."""
    run = _run(ctx)
    info = run.inplace_error if run else None
    if info is None:
        return
    where = node_at(report, info.location, info.op, info.module) or info.module or ""
    yield finding(
        "inplace-autograd",
        where,
        info.message,
        "Write the op out of place (`x = x + y` instead of `x += y` / `x.add_(y)`), "
        "`.clone()` the tensor before changing it, or use inplace=False on the module.",
    )


@rule("gradients-failed", "warning")
def gradients_failed(ctx: Context, report: Report) -> Iterator[Finding]:
    """The backward pass failed for another reason than an in-place op."""
    run = _run(ctx)
    if run is None or run.inplace_error is not None or not report.gradients.error:
        return
    if run.internal:  # the inspector failed, not the model: no finding
        return
    if report.gradients.computed:
        return
    yield finding(
        "gradients-failed",
        "",
        report.gradients.error,
        "Fix the error above; gradient health could not be checked.",
    )
