"""Memory pass: static memory, saved activations, peaks, timeline, batch scaling, advice,
and (real runs) the measured peak. See `inspector.memory` for how each figure is made."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from inspector.context import Context, Inputs
from inspector.detection import training_inputs
from inspector.fakevalues import new_fake_mode
from inspector.forkmap import fork_map_if_slow
from inspector.graph.exportcapture import WRAPPED, flat_tensors
from inspector.graph.fxcapture import FLAT_INPUTS
from inspector.memory import advice, scaling, setups
from inspector.memory.analysis import Analysis, analyse, batch_runs, fb_peak, rerun
from inspector.memory.checkpointing import run_checkpointed
from inspector.memory.measure import measure, relative_error
from inspector.memory.namedblocks import current_patterns
from inspector.memory.nodes import node_memory
from inspector.memory.optimizer import optimizer_state_bytes
from inspector.memory.shadow import fake_shadow
from inspector.memory.step import unique_tensors
from inspector.memory.timeline import downsample
from inspector.report import BatchPoint, MeasuredMemory, Memory
from inspector.results import AutocastStep
from inspector.units import ACCELERATOR_BUDGETS

__all__ = ["run", "MEANINGFUL_SHARE"]

MEANINGFUL_SHARE = 0.01  # advice that saves less of the training-step peak is noise
_NEEDS_TRAIN_INPUTS = (
    "memory: training memory needs a forward that runs in train mode, and this one fails "
    "with these inputs (only eval mode was captured): give what train mode needs, such as "
    "targets, in the input spec or example_inputs()."
)


def run(ctx: Context) -> None:
    with training_inputs(ctx, "memory"):  # a detector given images only gets targets
        _run(ctx)


def _run(ctx: Context) -> None:
    mem = ctx.report.memory
    mem.optimizer = ctx.options.optimizer
    mem.activation_dtype = ctx.options.dtype
    try:
        a = analyse(ctx)
    except Exception as exc:  # the model cannot train here; other passes say why
        _warn(ctx, f"memory analysis skipped: {type(exc).__name__}: {_first_line(exc)}")
        if ctx.capture is not None and ctx.capture.eval_mode:
            _warn(ctx, _NEEDS_TRAIN_INPUTS)
        return
    ctx.report.meta.warnings.extend(a.warnings)
    ctx.results.memory = a
    _static(ctx, mem, a)
    # a bf16 model without autocast computes in bf16: say so, not "float32"
    mem.activation_dtype = _activation_dtype(ctx.options.dtype, mem.param_dtype)
    _peaks(mem, a)
    for name, part in _PARTS:
        try:
            part(ctx, mem, a)
        except Exception as exc:  # one part failing keeps the rest of the section
            _warn(ctx, f"memory {name}: {type(exc).__name__}: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _warn(ctx: Context, text: str) -> None:
    ctx.report.meta.warnings.append(text)


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _static(ctx: Context, mem: Memory, a: Analysis) -> None:
    params = unique_tensors(ctx.model.parameters())
    by_dtype: dict[str, int] = {}
    for t in params + unique_tensors(ctx.model.buffers()):
        by_dtype[_dtype(t)] = by_dtype.get(_dtype(t), 0) + t.untyped_storage().nbytes()
    for t in params:  # gradients: one per trainable parameter, in its dtype
        if t.requires_grad:
            by_dtype[_dtype(t)] += t.untyped_storage().nbytes()
    state = optimizer_state_bytes(params, ctx.options.optimizer, ctx.options.device)
    for dtype, nbytes in state.items():
        by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
    mem.bytes_by_dtype = by_dtype
    if params:
        mem.param_dtype = max({_dtype(p) for p in params}, key=lambda d: by_dtype[d])
    mem.param_bytes, mem.buffer_bytes = a.train.param_bytes, a.train.buffer_bytes
    mem.grad_bytes, mem.optimizer_bytes = a.train.grad_bytes, a.train.optimizer_bytes


def _peaks(mem: Memory, a: Analysis) -> None:
    mem.saved_activation_bytes = a.train.saved_bytes
    mem.forward_peak_bytes, mem.forward_peak_node = a.forward.peak_bytes, a.forward.peak_label
    mem.train_peak_bytes, mem.train_peak_node = a.train.peak_bytes, a.train.peak_label
    mem.train_peak_phase = a.train.peak_phase
    mem.train_peak_by_seed = {str(seed): peak for seed, peak in a.peak_by_seed.items()}
    mem.timeline = downsample(a.train.points)
    inference_only = {
        f"{op} (inference forward)" for op in a.forward.unmodelled - a.train.unmodelled
    }
    mem.unmodelled_kernel_ops = sorted(a.train.unmodelled | inference_only)


def _nodes(ctx: Context, mem: Memory, a: Analysis) -> None:
    """Per node: saved bytes and live activation bytes after it."""
    gm = ctx.capture.graph_module if ctx.capture is not None else None
    if gm is not None and a.on_fake:
        per = node_memory(fake_shadow(gm, a.opts.fake_mode), _graph_inputs(ctx, a), a.opts)
        saved, live = per.saved_bytes, per.live_after
        for node in ctx.report.nodes:
            node.saved_bytes = saved.get(node.name, 0)
            node.live_bytes_after = live.get(node.name)
        return
    static = a.train.param_bytes + a.train.buffer_bytes + a.train.optimizer_bytes
    live = {p.label: p.live_bytes - static for p in a.train.points if p.phase == "forward"}
    for node in ctx.report.nodes:  # hooks capture: one node per module call
        if node.module_path is not None:
            node.saved_bytes = a.train.saved_by_label.get(node.module_path, 0)
            node.live_bytes_after = live.get(node.module_path)


def _graph_inputs(ctx: Context, a: Analysis) -> Inputs:
    """The captured graph's own calling convention: an export of the flattening wrapper
    takes the input tensors positionally."""
    gm = ctx.capture.graph_module
    flat = gm is not None and gm.meta.get(FLAT_INPUTS)  # an fx trace of the same wrapper
    if flat or (ctx.capture.method == "export" and ctx.capture.strip == WRAPPED):
        return Inputs(args=tuple(flat_tensors(a.inputs.args, a.inputs.kwargs)))
    return a.inputs


def _modules(ctx: Context, mem: Memory, a: Analysis) -> None:
    subtree = advice.subtree_bytes(a.train.saved_by_label)
    for module in ctx.report.modules:
        module.saved_activation_bytes = subtree.get(module.path, 0)


def _batch(ctx: Context, mem: Memory, a: Analysis) -> None:
    if not a.on_fake:
        _warn(ctx, "memory: batch scaling needs fake tensors; skipped")
        return
    runs = batch_runs(ctx, a)
    if not runs:
        return
    name, _ = scaling.batch_size_of(ctx.factory, ctx.inputs)
    mem.batch_dim = name or "dim 0 of the inputs"
    mem.batch_scaling = [
        BatchPoint(
            batch=b,
            forward_peak_bytes=f.peak_bytes,
            train_peak_bytes=max(t.phase_peaks.values()),
            saved_activation_bytes=t.saved_bytes,
        )
        for b, t, f in runs
    ]
    # forward and backward by stretch; the optimizer step by its (resident-state) peak
    lines = scaling.window_lines(
        [(b, [peak for phase, peak in t.windows if phase != "optimizer"]) for b, t, _ in runs]
    )
    if lines is None:
        lines = scaling.phase_lines(
            [(b, {p: v for p, v in t.phase_peaks.items() if p != "optimizer"}) for b, t, _ in runs]
        )
    grows = scaling.steepest(lines)
    lines.append(scaling.fit_line([(b, t.phase_peaks.get("optimizer", 0)) for b, t, _ in runs]))
    mem.fixed_bytes, mem.per_sample_bytes = round(grows.fixed), round(grows.per_sample)
    budgets = sorted(set(ACCELERATOR_BUDGETS) | set(ctx.options.budgets_bytes))
    mem.max_batch = {str(b): scaling.max_batch(lines, b) for b in budgets}


def _advice(ctx: Context, mem: Memory, a: Analysis) -> None:
    """Checkpointing and bf16 advice, each run on fake tensors and quoted as measured;
    advice that saves under 1% of the training-step peak is left out."""
    min_bytes = int(MEANINGFUL_SHARE * a.train.peak_bytes)
    mem.blocks = [path for path, _ in advice.blocks(a.model) if path]
    mem.named_blocks = list(current_patterns())
    savings = advice.block_savings(a.model, a.train.saved, a.train.module_outputs)
    checked, every = _check_checkpoints(ctx, a, savings)
    mem.advice = advice.checkpoint_advice(savings, checked, every, min_bytes)
    float32 = any(p.dtype == torch.float32 for p in ctx.model.parameters())
    if a.opts.autocast is None and float32 and a.on_fake:
        bf16 = rerun(a, a.inputs, autocast=torch.bfloat16)
        peak = max(fb_peak(bf16), a.train.phase_peaks.get("optimizer", 0))
        ctx.results.memory_bf16 = AutocastStep(bf16.saved_bytes, fb_peak(bf16))
        if a.train.peak_bytes - peak >= min_bytes:
            mem.advice.append(
                advice.autocast_advice(
                    a.train.peak_bytes, a.train.saved_bytes, peak, bf16.saved_bytes
                )
            )


def _check_checkpoints(
    ctx: Context, a: Analysis, savings: list[tuple[int, str, str]]
) -> tuple[dict[str, advice.Checked], advice.Checked | None]:
    """Run the advised checkpointing on fake tensors: each advised block (one per group of
    same-type blocks with the same predicted saving) and every block at once."""
    if not a.on_fake or not savings:
        return {}, None
    # one run per group of same-type blocks with the same predicted saving, and every
    # block at once: independent fake steps, side by side where each is slow enough
    firsts: dict[tuple[str, int], str] = {}
    for predicted, path, kind in savings[: advice.TOP]:
        firsts.setdefault((kind, predicted), path)
    runs: list[tuple[list[str], str]] = [([path], path) for path in firsts.values()]
    if len(savings) > 1:
        runs.append(([path for _, path, _ in savings], ""))
    # the first step paid the cold start (first fake dispatches); a rerun is what each
    # of these costs
    done = fork_map_if_slow(lambda run: _checked(a, *run), runs, a.rerun_cost)
    ran = dict(zip(firsts, done, strict=False))
    checked = {path: ran[kind, predicted] for predicted, path, kind in savings[: advice.TOP]}
    every = done[-1] if len(savings) > 1 else None
    ctx.results.memory_checkpointed = every
    return checked, every


def _checked(a: Analysis, paths: list[str], on: str) -> advice.Checked:
    run = run_checkpointed(a, paths)
    return advice.Checked(
        run.saving(a.train), run.saved_bytes, run.fb_peak_bytes, run.peak_bytes, on
    )


def _setups(ctx: Context, mem: Memory, a: Analysis) -> None:
    """The same model under the other optimizers, bf16 autocast and checkpointing."""
    trainable = [p for p in unique_tensors(a.model.parameters()) if p.requires_grad]
    names = sorted(set(setups.COMPARED_OPTIMIZERS) | {ctx.options.optimizer})
    mode = a.opts.fake_mode or new_fake_mode()
    blocks = [x.saving_bytes for x in mem.advice if x.kind == "checkpoint"]
    every = next((x.saving_bytes for x in mem.advice if x.kind == "checkpoint-all"), 0)
    bf16, run = ctx.results.memory_bf16, ctx.results.memory_checkpointed
    t = a.train
    mem.setups = setups.setups(
        setups.Measured(
            optimizer=ctx.options.optimizer,
            dtype=mem.activation_dtype,
            resident_bytes=t.param_bytes + t.buffer_bytes + t.input_bytes,
            param_bytes=t.param_bytes,
            grad_bytes=t.grad_bytes,
            saved_bytes=t.saved_bytes,
            fb_peak_bytes=fb_peak(t),
            step=setups.step_costs(trainable, names, mode),
            bf16_saved_bytes=bf16.saved_bytes if bf16 else None,
            bf16_fb_peak_bytes=bf16.fb_peak_bytes if bf16 else None,
            checkpoint_saving_bytes=every,
            largest_block_bytes=max(blocks, default=0),
            checkpoint_kept_bytes=advice.unsaved_block_inputs(a.model, t) if every else 0,
            checkpoint_run=(run.saved_bytes, run.fb_peak_bytes) if run else None,
        )
    )


def _activation_dtype(autocast: str, param_dtype: str | None) -> str:
    """What activations are in: the autocast dtype, else the weights' own (a bf16 model
    computes in bf16 without autocast)."""
    if autocast == "float32" and param_dtype in ("bfloat16", "float16"):
        return {"bfloat16": "bf16", "float16": "fp16"}[param_dtype]
    return autocast


def _measured(ctx: Context, mem: Memory, a: Analysis) -> None:
    if ctx.options.fake or not ctx.options.measure:
        return
    m = measure(ctx.model, ctx.inputs, a.opts if not a.on_fake else _real(a))
    mem.measured = MeasuredMemory(
        method=m.method,
        device=m.device,
        train_peak_bytes=m.train_peak_bytes,
        saved_activation_bytes=m.saved_activation_bytes,
        forward_peak_bytes=m.forward_peak_bytes,
        train_peak_error=relative_error(mem.train_peak_bytes, m.train_peak_bytes),
        saved_activation_error=relative_error(mem.saved_activation_bytes, m.saved_activation_bytes),
        forward_peak_error=relative_error(mem.forward_peak_bytes, m.forward_peak_bytes),
    )
    ctx.results.memory_measured = m


def _real(a: Analysis) -> Any:
    from dataclasses import replace

    return replace(a.opts, fake_mode=None)


_PARTS: list[tuple[str, Callable[[Context, Memory, Analysis], None]]] = [
    ("per node", _nodes),
    ("per module", _modules),
    ("batch scaling", _batch),
    ("advice", _advice),
    ("set-ups", _setups),
    ("measurement", _measured),
]
