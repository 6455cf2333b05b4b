"""The bytes a run allocates, op by op: each output whose storage is none of its inputs'
(not a view, not an in-place result) is new. Nothing is tracked across ops, so what it
counts is every allocation of the run, freed or not: a bound on what the run can hold at
once, or save for a backward. Used on the hooks capture's forward, whose graph shows
module calls, not the ops between them (inspector/memory/rough.py)."""

from __future__ import annotations

from typing import Any

from torch.utils._pytree import tree_leaves

from inspector.dispatchmode import LeanDispatchMode

__all__ = ["AllocatedBytes"]


class AllocatedBytes(LeanDispatchMode):
    """Within: `total`, the bytes of every new storage an op returned."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):  # noqa: ANN204 - torch's
        out = func(*args, **(kwargs or {}))
        inputs = {key for t in tree_leaves((args, kwargs)) if (key := _storage(t)) is not None}
        seen: set[int] = set()
        for t in tree_leaves(out):
            key = _storage(t)
            if key is not None and key not in inputs and key not in seen:
                seen.add(key)
                self.total += t.untyped_storage().nbytes()
        return out


def _storage(t: Any) -> int | None:
    """A tensor's storage identity; None for anything else (and a storage-less tensor)."""
    try:
        return t.untyped_storage()._cdata
    except (AttributeError, RuntimeError, NotImplementedError):
        return None
