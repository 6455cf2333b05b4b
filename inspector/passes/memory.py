"""Memory pass: static memory, saved activations, peaks, timeline, batch scaling and
advice. See `inspector.memory` for how each figure is made; the real step that measures
the estimate is the measure pass's (inspector/passes/measure.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from inspector.context import Context
from inspector.detection import training_inputs
from inspector.memory import advice, scaling, setups
from inspector.memory.analysis import Analysis, analyse, fb_peak
from inspector.memory.denormals import denormals_flushed
from inspector.memory.independent import (
    Runs,
    checkpoint_groups,
    checkpoint_key,
    run_independent,
)
from inspector.memory.namedblocks import current_patterns
from inspector.memory.optimizer import optimizer_state_bytes
from inspector.memory.step import unique_tensors
from inspector.memory.timeline import downsample
from inspector.report import BatchPoint, Memory
from inspector.units import ACCELERATOR_BUDGETS

__all__ = ["run"]

_NEEDS_TRAIN_INPUTS = (
    "memory: training memory needs a forward that runs in train mode, and this one fails "
    "with these inputs (only eval mode was captured): give what train mode needs, such as "
    "targets, in the input spec or example_inputs()."
)


def run(ctx: Context) -> None:
    # a detector given images only gets targets; a real copy's steps compute values only
    # for its branches, so denormals need not cost their slow arithmetic
    with training_inputs(ctx, "memory"), denormals_flushed():
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
    runs = run_independent(ctx, a)  # side by side: inspector/memory/independent.py
    for name, part in _PARTS:
        try:
            part(ctx, mem, a, runs)
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


def _nodes(ctx: Context, mem: Memory, a: Analysis, runs: Runs) -> None:
    """Per node: saved bytes and live activation bytes after it."""
    if runs.has("nodes"):  # the captured graph, run node by node on fake tensors
        per = runs.get("nodes")
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


def _modules(ctx: Context, mem: Memory, a: Analysis, runs: Runs) -> None:
    subtree = advice.subtree_bytes(a.train.saved_by_label)
    for module in ctx.report.modules:
        module.saved_activation_bytes = subtree.get(module.path, 0)


def _batch(ctx: Context, mem: Memory, a: Analysis, planned: Runs) -> None:
    if not a.on_fake:
        _warn(ctx, "memory: batch scaling needs fake tensors; skipped")
        return
    runs, _ = planned.get("batch")
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


def _advice(ctx: Context, mem: Memory, a: Analysis, runs: Runs) -> None:
    """Checkpointing and bf16 advice, each run on fake tensors and quoted as measured;
    advice that saves under 1% of the training-step peak is left out."""
    min_bytes = advice.meaningful_bytes(a.train.peak_bytes)
    mem.blocks = [path for path, _ in advice.blocks(a.model) if path]
    mem.named_blocks = list(current_patterns())
    savings = runs.savings.get()
    checked, every = _check_checkpoints(ctx, a, savings, runs)
    mem.advice = advice.checkpoint_advice(savings, checked, every, min_bytes)
    if runs.has("bf16"):
        bf16 = ctx.results.memory_bf16 = runs.get("bf16")
        peak = max(bf16.fb_peak_bytes, a.train.phase_peaks.get("optimizer", 0))
        if a.train.peak_bytes - peak >= min_bytes:
            mem.advice.append(
                advice.autocast_advice(
                    a.train.peak_bytes, a.train.saved_bytes, peak, bf16.saved_bytes
                )
            )


def _check_checkpoints(
    ctx: Context, a: Analysis, savings: list[tuple[int, str, str]], runs: Runs
) -> tuple[dict[str, advice.Checked], advice.Checked | None]:
    """The advised checkpointing, run on fake tensors (inspector/memory/independent.py):
    each advised block (one run per group of same-type blocks with the same predicted
    saving) and every block at once."""
    if not a.on_fake or not savings:
        return {}, None
    groups = checkpoint_groups(savings)  # groups that could not reach the share made no run
    checked = {
        path: runs.get(checkpoint_key(on))
        for path, on in groups.items()
        if runs.has(checkpoint_key(on))
    }
    every = runs.get(checkpoint_key("")) if runs.has(checkpoint_key("")) else None
    ctx.results.memory_checkpointed = every
    return checked, every


def _setups(ctx: Context, mem: Memory, a: Analysis, runs: Runs) -> None:
    """The same model under the other optimizers, bf16 autocast and checkpointing."""
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
            step=runs.get("step costs"),
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


_PARTS: list[tuple[str, Callable[[Context, Memory, Analysis, Runs], None]]] = [
    ("per node", _nodes),
    ("per module", _modules),
    ("batch scaling", _batch),
    ("advice", _advice),
    ("set-ups", _setups),
]
