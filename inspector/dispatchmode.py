"""`LeanDispatchMode`: a TorchDispatchMode whose hook costs only what it does.

Recent PyTorch wraps every dispatch mode's `__torch_dispatch__` in `torch._dynamo.disable`
so that a compiled region never traces into a mode's Python: per call, a wrapper that sets
the eval-frame callback four times and asks whether an export is running, 4 us on this
machine against 7 us for the rest of a no-op mode. Our modes see every op of a fake step,
in the fake mode and in each mode over it (a tracked LeViT training step: 12,000 hook
calls, 7,000 of them the tracker's, the autograd engine's device queries among them).
Here the hook is guarded the cheap way, with the same effect: the callback is switched
off around it, and put back only where one was set (inside a running compiled region).
The tracked fake step: 2.5-6 % less CPU (bench/dispatch_guard.py).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

try:  # torch >= 2.0; without it the modes keep torch's own guard
    from torch._C._dynamo.eval_frame import set_eval_frame as _set_eval_frame
except ImportError:  # pragma: no cover - an unusual build
    _set_eval_frame = None

__all__ = ["LeanDispatchMode", "lean_dispatch", "unwrapped"]


def lean_dispatch(hook: Callable[..., Any]) -> Callable[..., Any]:
    """`hook` (a `__torch_dispatch__`) run with the eval-frame callback off."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202, N807
        prior = _set_eval_frame(None)
        if prior is None:  # the usual case: nothing was set, nothing to put back
            return hook(self, func, types, args, kwargs)
        try:
            return hook(self, func, types, args, kwargs)
        finally:
            _set_eval_frame(prior)

    __torch_dispatch__.__wrapped__ = hook  # what `inspect` and torch's checks look through
    return __torch_dispatch__


_GUARD_CODE = lean_dispatch(lambda *_: None).__code__  # every mode's guard runs this code
_guard_skipped = False


def _skip_guard_frames() -> None:
    """Have Dynamo leave the guard's frame alone, as it does torch's wrapper (its file is
    one Dynamo skips): a compiled region that dispatches to the mode would otherwise try
    to compile the guard itself. Only once Dynamo is imported: no compiled region before,
    and importing it costs 1.5 s."""
    global _guard_skipped
    dynamo = sys.modules.get("torch._dynamo")
    if _guard_skipped or dynamo is None:
        return
    with contextlib.suppress(Exception):  # an older torch without it: a graph break instead
        dynamo.eval_frame.skip_code(_GUARD_CODE)
    _guard_skipped = True


def unwrapped(hook: Callable[..., Any]) -> Callable[..., Any]:
    """A `__torch_dispatch__` without torch's dynamo-disable wrapper, if it has one."""
    return getattr(hook, "__wrapped__", hook)


class LeanDispatchMode(TorchDispatchMode):
    """A dispatch mode whose subclasses' `__torch_dispatch__` is guarded by `lean_dispatch`
    instead of torch's wrapper."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # torch's switch: our guard replaces its wrapper
        return _set_eval_frame is None

    def __enter__(self) -> Any:
        _skip_guard_frames()
        return super().__enter__()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        hook = cls.__dict__.get("__torch_dispatch__")
        if _set_eval_frame is not None and hook is not None and not isinstance(hook, classmethod):
            cls.__torch_dispatch__ = lean_dispatch(hook)
