"""A capture leaves the user's model as it found it.

A forward may store what it computes on its modules: HF Swin's
`set_shift_and_window_size` sets `self.window_size = min(input_resolution)`, so while fx
traces it the module keeps a traced value (a Proxy) that every later run then trips
over (`floordiv_6 has no value`), which used to be reported as the model failing to
train. Every module's attributes, and its parameter, buffer and child tables, are put
back as they were; and the buffers' values, which a trace can change in place.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["attributes_kept", "buffers_kept"]

_TABLES = ("_parameters", "_buffers", "_modules")


@contextmanager
def attributes_kept(model: nn.Module, new_kept: str | None = None) -> Iterator[None]:
    """Restore every module's own attributes (not tensor contents) on the way out; those
    added are dropped, but where their names start with `new_kept` (fx's constants, which
    its GraphModule copies from the root once the trace is done)."""
    saved = [(m, dict(vars(m)), _tables(m)) for m in model.modules()]
    try:
        yield
    finally:
        for module, attrs, tables in saved:
            _restore(module, attrs, tables, new_kept)


def _tables(module: nn.Module) -> dict[str, dict[str, Any]]:
    return {name: dict(getattr(module, name, None) or {}) for name in _TABLES}


def _restore(
    module: nn.Module, attrs: dict[str, Any], tables: dict[str, dict], new_kept: str | None
) -> None:
    own = vars(module)
    for name in set(own) - set(attrs):
        if new_kept is None or not name.startswith(new_kept):
            del own[name]
    own.update(attrs)
    for name, contents in tables.items():
        table = own.get(name)
        if isinstance(table, dict):  # the same dict object, its entries put back
            table.clear()
            table.update(contents)


@contextmanager
def buffers_kept(model: nn.Module) -> Iterator[None]:
    """fx's tracer hands a module's buffers to its code as the real tensors (parameters
    become proxies, buffers do not), so what the code does to them in place happens: a
    BatchNorm subclass fx traces through (timm's BatchNormAct2d) runs
    `self.num_batches_tracked.add_(1)` in train mode, once a trace. Every buffer whose
    version moved gets its value back: the passes after read the running stats as the
    user built them (a fresh model's defaults, not stats "tracked" by our trace)."""
    with torch.no_grad():
        kept = [(b, v, b.clone()) for b in model.buffers() if (v := _version(b)) is not None]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, version, value in kept:
                if _version(buffer) != version:
                    buffer.copy_(value)


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's in-place version count; None for an inference tensor (it keeps none,
    and nothing outside inference mode can change it)."""
    try:
        return tensor._version
    except RuntimeError:
        return None
