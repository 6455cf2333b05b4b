"""Watch the user's forward, and their loss_fn after it, op by op: where the autograd path
is cut, which in-place ops run on tensors autograd tracks, and which module each op runs in."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from inspector.health.locate import user_location
from inspector.health.outputs import flat_tensors

__all__ = ["CutPoint", "InplaceOp", "ForwardRecorder", "recording", "op_name"]

_MAX_EVENTS = 200  # a model cutting its graph everywhere needs no more to be diagnosed


@dataclass
class CutPoint:
    """An op whose inputs require grad and whose outputs do not."""

    op: str
    module: str  # module path the op ran in ("" root)
    location: str | None  # "file.py:LINE"
    source_line: str | None
    grad_enabled: bool  # False: under torch.no_grad() / inference_mode
    params: set[str] = field(default_factory=set)  # parameter names that feed it
    in_loss: bool = False  # in loss_fn, after the forward returned

    def describe(self) -> str:
        how = f"`{self.op}`" + ("" if self.grad_enabled else " under torch.no_grad()")
        where = f" at {self.location}" if self.location else ""
        line = f" (`{self.source_line}`)" if self.source_line else ""
        inside = "loss_fn" if self.in_loss else f"module '{self.module or '(root)'}'"
        return f"{how} in {inside}{where}{line}"


@dataclass
class InplaceOp:
    op: str
    module: str
    location: str | None
    source_line: str | None
    target_grad_fn: str | None  # grad_fn of the tensor before it was overwritten


# Ops that leave autograd for Python or numpy values.
_TO_PYTHON = {"item", "tolist", "numpy", "__float__", "__int__", "__index__"}
# Ops that read only their input's shape, dtype and device: no gradient path to cut
# (`target = torch.zeros_like(out)` in a loss).
_SHAPE_ONLY = {
    "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
    "randint_like", "new_zeros", "new_ones", "new_empty", "new_full", "size", "dim",
}  # fmt: skip


def op_name(func: Any) -> str:
    """A torch function's or tensor method's name; a property's (`.shape`) for its getter."""
    owner = getattr(func, "__self__", None)
    if getattr(func, "__name__", "") == "__get__" and owner is not None:
        return getattr(owner, "__name__", "attribute")  # a property such as `.data`
    return getattr(func, "__name__", str(func))


def _is_inplace(name: str) -> bool:
    return (name.endswith("_") and not name.startswith("_")) or name in {
        "__iadd__",
        "__isub__",
        "__imul__",
        "__itruediv__",
        "__ipow__",
    }


class ForwardRecorder(TorchFunctionMode):
    def __init__(self, param_names: dict[int, str], user_files: Sequence[str]) -> None:
        super().__init__()
        self.param_names = param_names
        self.user_files = list(user_files)
        self.module_stack: list[str] = [""]
        self.called: dict[str, None] = {}  # module paths in order of first call
        self.used: dict[str, None] = {}  # parameter names in order of first use by an op
        self.cuts: list[CutPoint] = []
        self.inplace: list[InplaceOp] = []
        self.in_loss = False  # set while loss_fn runs on the forward's output

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        name = op_name(func)
        inputs = [t for _, t in flat_tensors((args, kwargs)) if t.requires_grad]
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        before = target.grad_fn if target is not None and _is_inplace(name) else None
        out = func(*args, **kwargs)
        for t in inputs:
            if id(t) in self.param_names:
                self.used.setdefault(self.param_names[id(t)], None)
        if inputs:
            self._observe(name, inputs, out, before)
        return out

    def _observe(self, name: str, inputs: list[torch.Tensor], out: Any, before: Any) -> None:
        outs = [t for _, t in flat_tensors(out)]
        if _is_inplace(name):
            if len(self.inplace) < _MAX_EVENTS:
                loc = user_location(self.user_files) or (None, None)
                grad_fn = type(before).__name__ if before is not None else None
                self.inplace.append(InplaceOp(name, self.module_stack[-1], *loc, grad_fn))
            return
        if name in _SHAPE_ONLY:
            return
        is_cut = name in _TO_PYTHON or (outs and not any(t.requires_grad for t in outs))
        if is_cut and len(self.cuts) < _MAX_EVENTS:
            loc = user_location(self.user_files) or (None, None)
            cut = CutPoint(name, self.module_stack[-1], *loc, torch.is_grad_enabled())
            cut.in_loss = self.in_loss
            cut.params = _feeding_params(inputs, self.param_names)
            self.cuts.append(cut)


def _feeding_params(tensors: list[torch.Tensor], names: dict[int, str]) -> set[str]:
    """Parameters reachable backwards through the autograd graph from `tensors`."""
    found = {names[id(t)] for t in tensors if id(t) in names}
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
    seen: set[int] = set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        variable = getattr(fn, "variable", None)  # AccumulateGrad: a leaf
        if variable is not None and id(variable) in names:
            found.add(names[id(variable)])
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return found


@contextmanager
def recording(model: nn.Module, user_files: Sequence[str]) -> Iterator[ForwardRecorder]:
    """A recorder active over the block, with the module stack kept by forward hooks."""
    names = {id(p): n for n, p in model.named_parameters()}
    recorder = ForwardRecorder(names, user_files)
    handles = []
    for path, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(_push(recorder, path)))
        handles.append(module.register_forward_hook(_pop(recorder), always_call=True))
    try:
        with recorder:
            yield recorder
    finally:
        for handle in handles:
            handle.remove()


def _push(recorder: ForwardRecorder, path: str):  # noqa: ANN202
    def hook(module: nn.Module, args: Any) -> None:
        recorder.module_stack.append(path)
        recorder.called.setdefault(path, None)

    return hook


def _pop(recorder: ForwardRecorder):  # noqa: ANN202
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if len(recorder.module_stack) > 1:
            recorder.module_stack.pop()

    return hook
