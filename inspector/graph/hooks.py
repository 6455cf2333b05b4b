"""The last-resort capture: forward hooks on every module, one record per module call.

A record's FLOPs are its own (inclusive minus its children's calls), so records add up.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from inspector.graph.flops import forward_flop_counter
from inspector.graph.records import NodeRecord, user_location_from_stack
from inspector.graph.tensors import nbytes, tensor_info, tensor_leaves

__all__ = ["record_hooks"]


class _HookRecorder:
    def __init__(self, model: nn.Module, counter: FlopCounterMode | None, user_files: list[str]):
        self.paths = {id(m): p for p, m in model.named_modules(remove_duplicate=False)}
        self.counter = counter
        self.user_files = user_files
        self.records: list[NodeRecord] = []
        # (record index, flops at start, children's inclusive flops, call key, path)
        self.stack: list[tuple[int, int, list[int], str, str]] = []
        self.ncalls: dict[str, int] = {}
        # id(tensor) -> (the tensor, held weakly; the record that returned it): a freed
        # tensor's id comes back on another, which no record returned
        self.producer: dict[int, tuple[weakref.ref, int]] = {}

    def _flops(self) -> int:
        return self.counter.get_total_flops() if self.counter is not None else 0

    def pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        path = self.paths.get(id(module), "")
        n = self.ncalls.get(path, 0)
        self.ncalls[path] = n + 1
        key = path if n == 0 else f"{path}@{n}"
        ins = tensor_leaves((args, kwargs))
        outer = [(k, p) for _, _, _, k, p in self.stack if p]
        self.stack.append((len(self.records), self._flops(), [], key, path))
        self.records.append(
            NodeRecord(
                name=(path or "model") + ("" if n == 0 else f"@{n}"),
                op="module",
                target=type(module).__name__,
                module_path=path,
                calls=outer + ([(key, path)] if path else []),
                inputs=sorted({i for i in map(self._producer_of, ins) if i is not None}),
                in_tensors=[tensor_info(t) for t in ins],
                params=sum(p.numel() for p in module.parameters(recurse=False)),
                location=self._caller(),
            )
        )

    def post(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        index, start, kids, _, _ = self.stack.pop()
        inclusive = self._flops() - start
        rec = self.records[index]
        rec.flops = inclusive - sum(kids)
        if self.stack:
            self.stack[-1][2].append(inclusive)
        outs = tensor_leaves(output)
        rec.out_tensors = [tensor_info(t) for t in outs]
        for t in outs:
            # a parent returning its child's tensor: the child's, its bytes counted once
            if self._producer_of(t) is None:
                self.producer[id(t)] = (weakref.ref(t), index)
                rec.output_bytes += nbytes(t)

    def _producer_of(self, t: torch.Tensor) -> int | None:
        held = self.producer.get(id(t))
        return held[1] if held is not None and held[0]() is t else None

    def _caller(self) -> str | None:
        if not self.user_files:
            return None
        frame, lines = sys._getframe(2), []
        for _ in range(12):  # the user's line that called this module, when near
            if frame is None:
                break
            lines.append(f'File "{frame.f_code.co_filename}", line {frame.f_lineno}')
            frame = frame.f_back
        return user_location_from_stack("\n".join(reversed(lines)), self.user_files)


def record_hooks(
    model: nn.Module,
    call: Any,
    *,
    count_flops: bool = True,
    user_files: list[str] | None = None,
) -> list[NodeRecord]:
    """Run `call()` (which runs `model`) with hooks on every module; one record per call."""
    counter = forward_flop_counter() if count_flops else None
    rec = _HookRecorder(model, counter, list(user_files or []))
    handles = []
    for module in {id(m): m for m in model.modules()}.values():
        handles.append(module.register_forward_pre_hook(rec.pre, with_kwargs=True))
        handles.append(module.register_forward_hook(rec.post, with_kwargs=True))
    try:
        with torch.no_grad():
            if counter is not None:
                with counter:
                    call()
            else:
                call()
    finally:
        for h in handles:
            h.remove()
    return rec.records
