"""Ground truth: what one real training step allocates, by the same definition as the
estimate (see `step.py`).

CPU: `torch.profiler` with `profile_memory=True` records every allocation and free with
its size; the running sum over time is the live bytes, and everything counted (the copy
of the weights, the inputs, the optimizer state) is allocated inside the profile.
CUDA: `torch.cuda.max_memory_allocated` around the same step; the caching allocator
rounds every block up to 512 bytes, which the estimate mirrors with `round_to=512`. The
cuBLAS workspaces, made once per process, are made before the step (`_warm_cublas`).

The step runs on a deep copy, so the user's weights and buffers are untouched.
Two windows, in this order: an inference forward (eval, no_grad; no optimizer state
yet), and the training step after the optimizer's warm-up. Inside the step, the forward
and loss are a window of their own: what they leave allocated is what autograd saved,
plus the loss. The inputs were allocated before it, so those autograd saved (the first
layer's input, token ids) are added by storage, seen by a saved-tensors hook.
On the CPU the inference forward may have been recorded already, on the load's input
check (inference.py): its peak above its start then stands on what the step holds once
its copy of the weights and inputs are made, and the step runs none.
On the CPU the optimizer makes its state and its step's allocations without their
arithmetic, as does the copy where no forward reads it (warmup.py `allocations_only`):
what is allocated does not depend on the values, and the copy is thrown away after.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from inspector.context import Inputs
from inspector.memory.allocations import (
    WINDOW_PREFIX,
    allocations_recorded,
    lifetimes,
    read_events,
    storage_of,
)
from inspector.memory.loss import compute_loss
from inspector.memory.optimizer import make_optimizer
from inspector.memory.shadow import clone_inputs, real_shadow
from inspector.memory.step import StepOptions, unique_tensors, warm_up
from inspector.memory.warmup import allocations_only

__all__ = [
    "Measurement", "measure", "relative_error", "OptimizerPhase", "measure_optimizer_phase",
    "SavedInputs",
]  # fmt: skip


@dataclass
class Measurement:
    method: str
    device: str
    forward_peak_bytes: int
    saved_activation_bytes: int
    train_peak_bytes: int
    step_seconds: float  # wall time of the measured step (on the CPU, its optimizer allocates only)


def relative_error(estimate: int | None, measured: int | None) -> float | None:
    if estimate is None or not measured:
        return None
    return (estimate - measured) / measured


def measure(
    model: nn.Module, inputs: Inputs, opts: StepOptions, inference: int | None = None
) -> Measurement:
    """`inference`: the inference forward's peak above its start, recorded on these
    inputs already (inference.py, CPU only): the step runs no inference forward."""
    # the estimate's first draws (a step that branches on random draws, as layerdrop,
    # is measured on the same ones); the caller's RNG is restored
    devices = [torch.cuda.current_device()] if opts.device == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return _measure(model, inputs, opts, inference)


def _measure(
    model: nn.Module, inputs: Inputs, opts: StepOptions, inference: int | None
) -> Measurement:
    meter: _Meter = _CudaMeter() if opts.device == "cuda" else _ProfilerMeter()
    with meter.recording():
        shadow, batch, trainable, optimizer = _resident(meter, model, inputs, opts, inference)
        torch.manual_seed(opts.seed)
        start = time.perf_counter()
        with meter.window("step"):
            kept_apart = _train_step(shadow, batch, opts, optimizer, trainable, meter)
        seconds = time.perf_counter() - start
    return Measurement(
        method=meter.method,
        device=opts.device,
        forward_peak_bytes=(
            meter.peak("forward") if inference is None else meter.held("setup") + inference
        ),
        saved_activation_bytes=meter.net("saved") + kept_apart,
        train_peak_bytes=meter.peak("step"),
        step_seconds=seconds,
    )


@dataclass
class OptimizerPhase:
    """What a forward and backward do not show of the measured step (inspector/memory/
    merged.py): live bytes, from the start, once the copy of the weights, buffers and
    inputs is made (`setup`), with the optimizer's state (`resident`), once `train()` is
    called (`training`), with a zero gradient for every trainable parameter
    (`with_grads`), and the peak of one `step()` over them; and the inference forward's
    peak."""

    setup_bytes: int
    resident_bytes: int
    training_bytes: int  # as the training forward starts: after `train()`
    with_grads_bytes: int
    step_peak_bytes: int
    forward_peak_bytes: int
    seconds: float  # the optimizer's step, its allocations without its arithmetic


def measure_optimizer_phase(
    model: nn.Module, inputs: Inputs, opts: StepOptions, inference: int | None = None
) -> OptimizerPhase:
    """The measured step's set-up, inference forward (unless recorded at load:
    `inference`) and optimizer step, without its training forward and backward; on the
    CPU. The optimizer's step allocates by the gradients' shapes, not their values."""
    with torch.random.fork_rng(devices=[]):
        meter = _ProfilerMeter()
        with meter.recording():
            # with the inference forward recorded, no value of the copy is read
            copy_values = inference is None
            shadow, _, trainable, optimizer = _resident(
                meter, model, inputs, opts, inference, copy_values
            )
            with meter.window("train"):  # as the step begins: train() may let go of what
                shadow.train()  # eval() kept (LeViT's attention biases)
            with allocations_only(), meter.window("grads"):  # no value read: none made
                for p in trainable:
                    p.grad = torch.zeros_like(p)
            start = time.perf_counter()
            with allocations_only(), meter.window("step"):
                if optimizer is not None:
                    optimizer.step()
            seconds = time.perf_counter() - start
            for p in trainable:
                p.grad = None
    setup = meter.held("setup")
    return OptimizerPhase(
        setup_bytes=setup,
        resident_bytes=meter.held("state"),
        training_bytes=meter.held("train"),
        with_grads_bytes=meter.held("grads"),
        step_peak_bytes=meter.peak("step"),
        forward_peak_bytes=meter.peak("forward") if inference is None else setup + inference,
        seconds=seconds,
    )


def _resident(
    meter: _Meter,
    model: nn.Module,
    inputs: Inputs,
    opts: StepOptions,
    inference: int | None,
    copy_values: bool = True,
) -> tuple[nn.Module, Inputs, list[nn.Parameter], torch.optim.Optimizer | None]:
    """What the step begins on, each part in its window: the copy of the weights, buffers
    and inputs ("setup"), the inference forward where not recorded at load ("forward"),
    the optimizer's state ("state"). `copy_values` False: the copy's floating tensors are
    allocated as the copy makes them, and not filled (no value of theirs will be read)."""
    with nullcontext() if copy_values else _valueless(opts), meter.window("setup"):
        shadow = real_shadow(model)
        batch = clone_inputs(inputs)
    if inference is None:
        with meter.window("forward"):
            _inference(shadow, batch, opts)
    trainable = [p for p in unique_tensors(shadow.parameters()) if p.requires_grad]
    with _valueless(opts), meter.window("state"):
        optimizer = make_optimizer(opts.optimizer, trainable)
        # the ground truth: every parameter's state as a real loop's, allocated as its first
        # step does; the step's values are not wanted (inspector.memory.warmup)
        warm_up(optimizer, trainable, shorten=False, values=False)
    return shadow, batch, trainable, optimizer


def _valueless(opts: StepOptions) -> AbstractContextManager[None]:
    """Where the optimizer's values are never read (its step on the CPU makes its
    allocations without its arithmetic): its state allocated and not filled."""
    return allocations_only() if opts.device == "cpu" else nullcontext()


def _autocast(opts: StepOptions):  # noqa: ANN202
    if opts.autocast is None:
        return nullcontext()
    return torch.autocast(device_type=opts.device, dtype=opts.autocast)


def _inference(model: nn.Module, batch: Inputs, opts: StepOptions) -> None:
    model.eval()
    with torch.no_grad(), _autocast(opts):
        output = batch.call(model)
        del output


def _round(n: int, opts: StepOptions) -> int:
    return -(-n // opts.round_to) * opts.round_to


def _train_step(
    model: nn.Module,
    batch: Inputs,
    opts: StepOptions,
    optimizer: torch.optim.Optimizer | None,
    trainable: list[nn.Parameter],
    meter: _Meter,
) -> int:
    """The step; returns what the "saved" window's net leaves out: the inputs' storages
    autograd saved, less the loss."""
    model.train()
    inputs = SavedInputs(batch, opts)
    with meter.mark("saved"), inputs.watched(), _autocast(opts):
        loss = compute_loss(opts.loss_fn, batch.call(model), batch)
    kept_apart = inputs.saved_bytes - _round(loss.untyped_storage().nbytes(), opts)
    loss.backward()
    if optimizer is not None:
        with _valueless(opts):
            optimizer.step()
    for p in trainable:
        p.grad = None
    return kept_apart


class SavedInputs:
    """The input tensors' storages that autograd saves during the block, by a pack hook
    that keeps each saved tensor as it is (nothing copied, nothing allocated)."""

    def __init__(self, batch: Inputs, opts: StepOptions) -> None:
        leaves = tree_leaves((batch.args, batch.kwargs))
        storages = [storage_of(t) for t in leaves if isinstance(t, torch.Tensor)]
        self._sizes = {s.data_ptr(): _round(s.nbytes(), opts) for s in storages if s is not None}
        self._saved: set[int] = set()

    @property
    def saved_bytes(self) -> int:
        return sum(self._sizes[ptr] for ptr in self._saved)

    def watched(self):  # noqa: ANN201
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = storage_of(t)
        if storage is not None and storage.data_ptr() in self._sizes:
            self._saved.add(storage.data_ptr())
        return t


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


class _Meter:
    method = ""

    @contextmanager
    def recording(self) -> Iterator[None]:
        yield

    def window(self, name: str):  # noqa: ANN201
        raise NotImplementedError

    def mark(self, name: str):  # noqa: ANN201
        """A window inside another: its net only (a CUDA peak is not reset)."""
        return self.window(name)

    def peak(self, name: str) -> int:
        raise NotImplementedError

    def net(self, name: str) -> int:
        raise NotImplementedError

    def held(self, name: str) -> int:
        """The live bytes as the window ends (what the step holds from then on)."""
        raise NotImplementedError


class _ProfilerMeter(_Meter):
    """Allocation events from torch.profiler; live bytes = running sum of their sizes."""

    method = "torch.profiler"

    def __init__(self) -> None:
        self.allocs: list[tuple[int, int]] = []  # (time_ns, +/- bytes)
        self.ranges: dict[str, tuple[int, int]] = {}

    @contextmanager
    def recording(self) -> Iterator[None]:
        with allocations_recorded() as roots:
            yield
        recorded = read_events(roots())
        self.ranges = recorded.windows
        self.allocs = lifetimes(recorded.events)

    def window(self, name: str):  # noqa: ANN201
        return torch.profiler.record_function(WINDOW_PREFIX + name)

    def _running(self, name: str) -> tuple[int, list[int]]:
        start, end = self.ranges[name]
        live, before, inside = 0, 0, []
        for t, size in self.allocs:
            live += size
            if t < start:
                before = live
            elif t <= end:
                inside.append(live)
        return before, inside

    def peak(self, name: str) -> int:
        before, inside = self._running(name)
        return max([before, *inside])

    def net(self, name: str) -> int:
        before, inside = self._running(name)
        return (inside[-1] if inside else before) - before

    def held(self, name: str) -> int:
        before, inside = self._running(name)
        return inside[-1] if inside else before


class _CudaMeter(_Meter):
    """torch.cuda memory statistics, relative to what was allocated before we began."""

    method = "cuda.max_memory_allocated"

    def __init__(self) -> None:
        self.base = 0
        self.peaks: dict[str, int] = {}
        self.nets: dict[str, int] = {}

    @contextmanager
    def recording(self) -> Iterator[None]:
        _warm_cublas()
        torch.cuda.synchronize()
        self.base = torch.cuda.memory_allocated()
        yield

    @contextmanager
    def window(self, name: str) -> Iterator[None]:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        yield
        torch.cuda.synchronize()
        self.peaks[name] = torch.cuda.max_memory_allocated() - self.base
        self.nets[name] = torch.cuda.memory_allocated() - before

    @contextmanager
    def mark(self, name: str) -> Iterator[None]:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        yield
        torch.cuda.synchronize()
        self.nets[name] = torch.cuda.memory_allocated() - before

    def peak(self, name: str) -> int:
        return self.peaks[name]

    def net(self, name: str) -> int:
        return self.nets[name]


def _warm_cublas() -> None:
    """cuBLAS and cuBLASLt make a workspace per handle and stream at their first matmul and
    keep it for the life of the process (32 MiB each on an H200), in the caching
    allocator, and the autograd engine's thread has handles of its own: made here, before
    the base, they are the process's and not the step's, as in the estimate. Measured on
    an H200: a small CNN's step "took" 67.5 MiB the first time in a process, 2.6 MiB of
    it the model's."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        try:
            a = torch.ones(16, 16, device="cuda", dtype=dtype, requires_grad=True)
            y = torch.mm(torch.nn.functional.linear(a, a, a[0]), a)  # cuBLASLt, cuBLAS
            y.sum().backward()  # the autograd thread has handles (and workspaces) of its own
        except RuntimeError:  # a dtype this GPU has no matmul for
            continue
