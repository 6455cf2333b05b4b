"""Live-storage tracking: every tensor storage an op creates, until it is freed.

A `TorchDispatchMode` sees each aten op's outputs; a storage not seen before is a new
allocation (views and in-place ops share their input's storage). A weak reference on the
storage tells us when it is freed. The same code runs on real and on fake tensors, so the
count is what the step really allocates at the op level. What a kernel allocates below
that level (workspaces, reorders, scratchpads) comes from the per-op formulas of
`inspector.memory.kernels`; ops whose kernel memory no formula knows are named in
`unmodelled`. On CUDA the caching allocator rounds each block up to 512 bytes; pass
`round_to=512` to count what `torch.cuda.memory_allocated` counts.

A gradient that reaches a node from two places is summed by the autograd engine, in place
into the first when it holds the only reference to a dense tensor; with a Python dispatch
mode active (this one) or on fake tensors the engine adds out of place instead, so that
addition is counted as the plain run does it (`_accumulates`: DeBERTa-v2's peak +6.1% ->
exact).
"""

from __future__ import annotations

import gc
import re
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from inspector.dispatchmode import LeanDispatchMode
from inspector.memory.kernels import FORMULAS, UNKNOWN, KernelMemory, kernel_memory, op_name

__all__ = [
    "LiveTracker", "Point", "storage_key", "storage_bytes", "CUDA_BLOCK_BYTES", "label_kind",
]  # fmt: skip

CUDA_BLOCK_BYTES = 512  # the caching allocator's smallest block and rounding step


def storage_key(t: torch.Tensor) -> int:
    """Identity of the tensor's storage (shared by views and in-place results)."""
    return t.untyped_storage()._cdata


def storage_bytes(t: torch.Tensor, round_to: int = 1) -> int:
    n = t.untyped_storage().nbytes()
    return -(-n // round_to) * round_to if round_to > 1 else n


@dataclass
class Point:
    """One timeline step: the live bytes after `label` ran, in `phase`."""

    phase: str
    label: str | None
    live_bytes: int


@dataclass
class _Entry:
    nbytes: int
    producer: str | None  # label current when the storage was created
    kind: str  # "static" (params, buffers, optimizer state), "input", "step"
    ref: Any = None
    kernel_sized: bool = False  # its size is a kernel formula's, not the (fake) storage's
    node: tuple[str, int] | None = None  # the autograd node whose backward made it
    made_by: Any = None  # the op that made it, in backward


@lru_cache(maxsize=65536)
def _kind_key(phase: str, label: str | None) -> str:
    return f"{phase}|{label_kind(label) or ''}"


def label_kind(label: str | None) -> str | None:
    """A module label without its block indices: where in a block it is (`h.3.attn` ->
    `h.*.attn`; a root-level stack's labels start with the index: `2.2` -> `*.*`)."""
    return re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", label) if label else label


class LiveTracker(LeanDispatchMode):
    """Counts live bytes; records the peak and a timeline of labelled points."""

    def __init__(self, round_to: int = 1) -> None:
        super().__init__()
        self.round_to = round_to
        self.entries: dict[int, _Entry] = {}
        self.live = 0
        self.phase = "forward"
        self.label: str | None = None
        self.modules: list[str] = []  # the paths of the modules running, outermost first
        self.peak = 0
        self.peak_label: str | None = None
        self.peak_phase = "forward"
        self.points: list[Point] = []
        self.phase_peaks: dict[str, int] = {}
        self.phase_labels: dict[str, str | None] = {}  # what ran at each phase's peak
        # "phase|kind" -> (highest live bytes, label): the kind is the label without block
        # indices, so a deep stack's runs at two depths line up kind by kind
        self.kind_peaks: dict[str, tuple[int, str | None]] = {}
        # the highest live bytes between consecutive marks: each is linear in the batch
        # for a fixed op sequence, so runs at two batches give the peak at any batch
        self.window_peaks: list[tuple[str, int]] = []  # (phase, peak)
        self._window = 0
        self._last_backward: str | None = None
        self.tag_backward = True  # label backward ops by their autograd node's tag
        self._gc_was_enabled = False
        self.unmodelled: set[str] = set()  # ops whose kernel memory is not counted
        # nn.Linear biases' storages, and the storage the last mm/bmm made: see _adds_bias
        self.linear_biases: set[int] = set()
        self._last_matmul: int | None = None
        self.op_count = 0  # ops dispatched: what a fake run costs (serving's decode steps)

    # Frees are seen through weakref callbacks: a tensor kept by a reference cycle would
    # die whenever the cycle collector happens to run, making peaks vary run to run. No
    # collection while tracking: what refcounting frees is freed at once, cycles never.
    def __enter__(self) -> LiveTracker:
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            if self._gc_was_enabled:
                gc.enable()

    # -- registering storages -------------------------------------------------------------
    def add(
        self,
        t: torch.Tensor,
        kind: str = "step",
        producer: str | None = None,
        node: tuple[str, int] | None = None,
        made_by: Any = None,
    ) -> None:
        key = storage_key(t)
        entry = self.entries.get(key)
        if entry is not None:
            if not entry.kernel_sized:
                self._maybe_resized(t, entry)
            return
        nbytes = storage_bytes(t, self.round_to)
        label = producer if producer is not None else self.label
        entry = _Entry(nbytes, label, kind, node=node, made_by=made_by)
        entry.ref = weakref.ref(t.untyped_storage(), self._freed_cb(key))
        self.entries[key] = entry
        self.live += nbytes

    def add_all(self, tensors: Any, kind: str, producer: str | None = None) -> None:
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self.add(t, kind, producer)

    def _freed_cb(self, key: int):  # noqa: ANN202 - a weakref callback
        def freed(_ref: weakref.ref) -> None:
            entry = self.entries.pop(key, None)
            if entry is not None:
                self.live -= entry.nbytes

        return freed

    def _maybe_resized(self, t: torch.Tensor, entry: _Entry) -> None:
        nbytes = storage_bytes(t, self.round_to)
        if nbytes != entry.nbytes:  # resize_ on an out= tensor
            self.live += nbytes - entry.nbytes
            entry.nbytes = nbytes

    # -- the dispatch hook ----------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.op_count += 1
        if func is _DEVICE:  # no memory; the engine asks it about ten times per backward op
            if self.phase == "backward" and self.tag_backward:  # the node it runs shows
                self._entered(torch._C._current_autograd_node())
            t = args[0]  # a fake one's answer (as the fake mode's), without its dispatch
            if type(t) is not FakeTensor:
                return func(*args, **(kwargs or {}))
            return torch.device("meta") if t.fake_mode.in_kernel_invocation else t.fake_device
        label, node = self.label, None
        if self.phase == "backward":
            current = torch._C._current_autograd_node()  # once per op: the hot path
            node = None if current is None else (current.name(), current._sequence_nr())
            if func is _ADD and self._accumulates(args, kwargs, node):
                self._release(args[0])  # the plain engine adds into it in place
            elif func in _SCATTERED and self._scatters_into_zeros(args, node):
                self._release(args[0])  # the plain formula scatters into it in place
            if self.tag_backward:
                label = self._entered(current)
        if func is _ADD and self.linear_biases and self._adds_bias(args, kwargs):
            self._release(args[0])  # F.linear adds its bias in place
        out = func(*args, **(kwargs or {}))
        if func in _MATMULS:
            self._last_matmul = storage_key(out)
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        for t in outputs:
            self.add(t, "step", label, node, func if node is not None else None)
        kernel = self._kernel(func, args, kwargs or {}, out, outputs)
        self._note_peak(label, kernel.scratch_bytes if kernel else 0)
        return out

    def _entered(self, current: Any) -> str | None:
        """The label of the autograd node running (that of the last labelled one where it
        has none); a new one closes the last one's window."""
        label = _label_of(current) or self._last_backward or self.label
        if label != self._last_backward:
            if self._last_backward is not None:
                self.mark(self._last_backward)
            self._last_backward = label
        return label

    def _accumulates(self, args: tuple, kwargs: dict | None, node: Any) -> bool:
        """The engine summing two gradients of one tensor: `add(a, b)` of two gradients
        made in this backward, `a` by an earlier node than the one running (the add comes
        after its last op: so on 8 zoo models' 270 such adds; `b` may be a view made
        earlier), same shape and dtype, `a` dense and alone in its storage."""
        if node is None or kwargs or len(args) != 2 or torch.is_grad_enabled():
            return False
        a, b = args
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        if is_traceable_wrapper_subclass(a) or is_traceable_wrapper_subclass(b):
            return False  # a tensor subclass (DTensor) is summed out of place by the engine too
        first, second = self.entries.get(storage_key(a)), self.entries.get(storage_key(b))
        if first is None or second is None or first.node in (None, node) or second.node is None:
            return False
        if a._is_view():  # its base lives on with it: the storage is not the buffer's alone
            return False
        whole = a.untyped_storage().nbytes() == a.numel() * a.element_size()
        return a.storage_offset() == 0 and whole and is_non_overlapping_and_dense(a)

    def _adds_bias(self, args: tuple, kwargs: dict | None) -> bool:
        """F.linear on an input it cannot fold into one addmm (a 3-D one that is not
        contiguous, as a batch-first GRU's; 4-D and up) is `matmul`, then
        `output.add_(bias)`, in place: but on a tensor subclass or under a dispatch mode
        (this one) PyTorch adds out of place, so the matmul's output and the sum were
        counted together (a batch-first GRU's input projection: 15% of its inference
        peak). `add(a, bias)` of such a bias (`linear_biases`) to what the last mm made is
        that add."""
        if len(args) != 2 or kwargs or not isinstance(args[1], torch.Tensor):
            return False
        a, bias = args
        if storage_key(bias) not in self.linear_biases or storage_key(a) != self._last_matmul:
            return False
        whole = a.untyped_storage().nbytes() == a.numel() * a.element_size()
        return whole and a.dtype == bias.dtype and bias.dim() == 1 and a.shape[-1] == bias.numel()

    def _scatters_into_zeros(self, args: tuple, node: Any) -> bool:
        """`gather` and `index_select` backward: zeros, then `scatter_add_`/`index_add_`
        into them; on a tensor subclass or under a dispatch mode (this one) PyTorch takes
        the out-of-place twin instead (DeBERTa-v2's relative-position gathers: 64 KiB
        more at its peak). So when the zeros were made by the node running."""
        if is_traceable_wrapper_subclass(args[0]):
            return False
        entry = self.entries.get(storage_key(args[0]))
        return entry is not None and entry.node == node and entry.made_by in _ZEROS

    def _release(self, t: torch.Tensor) -> None:
        entry = self.entries.pop(storage_key(t), None)
        if entry is not None:
            self.live -= entry.nbytes

    def _kernel(self, func, args, kwargs, out, outputs) -> KernelMemory | None:  # noqa: ANN001
        """The op's kernel memory: its outputs' true sizes, and the scratch on top of them."""
        kernel = kernel_memory(func, args, kwargs, out)
        if kernel is None:
            if func in UNKNOWN or func in FORMULAS:
                self.unmodelled.add(op_name(func, args))
            return None
        if kernel.partial:
            self.unmodelled.add(op_name(func, args))
        for index, nbytes in kernel.output_bytes.items():
            entry = self.entries.get(storage_key(outputs[index]))
            if entry is not None:  # a fake kernel says 0 bytes
                self.live += nbytes - entry.nbytes
                entry.nbytes, entry.kernel_sized = nbytes, True
        return kernel

    def _note_peak(self, label: str | None, scratch: int = 0) -> None:
        live = self.live + scratch  # scratch is live inside the op only
        self._window = max(self._window, live)
        if live > self.phase_peaks.get(self.phase, -1):
            self.phase_peaks[self.phase] = live
            self.phase_labels[self.phase] = label
        key = _kind_key(self.phase, label)
        if live > self.kind_peaks.get(key, (-1, None))[0]:
            self.kind_peaks[key] = (live, label)
        if live > self.peak:
            self.peak, self.peak_label, self.peak_phase = live, label, self.phase
            self._peak_at = len(self.points)

    def timeline(self) -> list[Point]:
        """The marked points, with the peak itself inserted where it happened."""
        points = list(self.points)
        at = getattr(self, "_peak_at", None)
        if at is not None:
            points.insert(at, Point(self.peak_phase, self.peak_label, self.peak))
        return points

    def set_phase(self, phase: str) -> None:
        if self.phase == "backward" and self._last_backward is not None:
            self.mark(self._last_backward)
        self.phase, self._last_backward = phase, None
        self._note_peak(self.label)

    # -- timeline -------------------------------------------------------------------------
    def mark(self, label: str | None, phase: str | None = None) -> None:
        """Record a timeline point: live bytes now, after `label` ran."""
        self.points.append(Point(phase or self.phase, label, self.live))
        self.window_peaks.append((phase or self.phase, max(self._window, self.live)))
        self._window = self.live

    def windows(self) -> list[tuple[str, int]]:
        """(phase, peak live bytes) of each stretch between marks, the open one too."""
        return [*self.window_peaks, (self.phase, max(self._window, self.live))]

    def bytes_where(self, kind: str) -> int:
        return sum(e.nbytes for e in self.entries.values() if e.kind == kind)

    def producer_of(self, t: torch.Tensor) -> _Entry | None:
        return self.entries.get(storage_key(t))


_ADD = torch.ops.aten.add.Tensor
_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default}
_DEVICE = torch.ops.prim.device.default
_SCATTERED = {torch.ops.aten.scatter_add.default, torch.ops.aten.index_add.default}
_ZEROS = {
    torch.ops.aten.zeros.default,
    torch.ops.aten.new_zeros.default,
    torch.ops.aten.zeros_like.default,
}


def is_non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """Its elements fill its memory exactly once, in some order of the dims."""
    expected = 1
    dims = zip(t.stride(), t.shape, strict=True)
    for stride, size in sorted((int(st), int(sz)) for st, sz in dims if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _label_of(node: Any) -> str | None:
    """The module label `tag_graph` put on an autograd node, if any."""
    return None if node is None else node.metadata.get("inspector_label")
