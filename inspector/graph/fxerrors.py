"""Why fx could not trace, in words a user can act on, with the place in the code.

torch.fx's own messages can be cryptic: a forward wrapped by a decorator that takes
`(*args, **kwargs)` (transformers' `can_return_tuple`, `deprecate_kwarg`) fails with
"code: co_varnames is too small" (or, without `**kwargs` in the forward, inside the
wrapper: "'NoneType' object has no attribute 'pop'"), because `symbolic_trace` reads the
parameters of the undecorated forward (`inspect.unwrap`) but calls the wrapper.
"""

from __future__ import annotations

import linecache
import os
import traceback
from typing import Any

from torch import nn

__all__ = ["FxTraceError", "error_type", "explain_plain", "explain_guided"]

_OURS = (os.sep + "torch" + os.sep, os.sep + "inspector" + os.sep)
# fx messages that name fx's own internals, and what they mean for the user's code
_MEANINGS = {
    "does not support item assignment": "fx cannot record an item assignment "
    "(`x[...] = ...`) on a traced tensor",
}


class FxTraceError(RuntimeError):
    """fx could not trace the model; the message says what and where. `error_type` is
    the type of fx's own error (`TraceError`, `ValueError`), the one to look up."""

    def __init__(self, message: str, error_type: str) -> None:
        super().__init__(message)
        self.error_type = error_type


def error_type(exc: BaseException) -> str:
    return getattr(exc, "error_type", None) or type(exc).__name__


def explain_plain(exc: BaseException, model: nn.Module) -> BaseException:
    """`exc` from `symbolic_trace(model)`, or a clearer FxTraceError in its place."""
    chain = _wrappers(type(model).forward)
    if chain and _in_decorators(exc, chain):
        return FxTraceError(_decorated(type(model), chain, exc), type(exc).__name__)
    return exc


def _in_decorators(exc: BaseException, chain: list[Any]) -> bool:
    """fx failed rewriting the wrapper's code, or inside the wrapper itself (given the
    undecorated forward's parameters it cannot take: `kwargs` None in `can_return_tuple`)."""
    if isinstance(exc, ValueError) and "co_varnames is too small" in str(exc):
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    # fx runs a rewritten copy of the wrapper's code: compare where the code comes from
    codes = {_origin(fn.__code__) for fn in chain[:-1] if hasattr(fn, "__code__")}
    return tb is not None and _origin(tb.tb_frame.f_code) in codes


def _origin(code: Any) -> tuple[str, int, str]:
    return code.co_filename, code.co_firstlineno, code.co_name


def _wrappers(fn: Any) -> list[Any]:
    """The functions a forward goes through: its decorators' wrappers, then itself."""
    chain = [fn]
    while hasattr(chain[-1], "__wrapped__") and len(chain) < 16:
        chain.append(chain[-1].__wrapped__)
    return chain if len(chain) > 1 else []


def _decorated(cls: type, chain: list[Any], exc: BaseException) -> str:
    wrappers = ", ".join(
        f"`{fn.__code__.co_qualname.split('.<locals>')[0]}` ({_where(fn)})"
        for fn in chain[:-1]
        if hasattr(fn, "__code__")
    )
    forward = chain[-1]
    return (
        f"torch.fx.symbolic_trace cannot trace {cls.__name__}.forward "
        f"({_where(forward)}) through its decorators {wrappers}: each takes "
        "(*args, **kwargs), and fx traces with the parameters of the undecorated forward "
        f"but calls the wrapper, which cannot take them ({type(exc).__name__}: {exc})"
    )


def _where(fn: Any) -> str:
    """`file:line` of a function's `def` (its code starts at its first decorator)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return "?"
    line = code.co_firstlineno
    for n in range(line, line + 32):
        if linecache.getline(code.co_filename, n).lstrip().startswith(("def ", "async def ")):
            line = n
            break
    return f"{_short(code.co_filename)}:{line}"


def _short(filename: str) -> str:
    """A library file from its package down (`transformers/...`); else its name."""
    marker = "site-packages" + os.sep
    if marker in filename:
        return filename.split(marker, 1)[1]
    return os.path.basename(filename)


def explain_guided(exc: BaseException) -> str:
    """The guided trace's failure: what, and the innermost line of model or library code
    (not torch's, not ours) it stopped at."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for words, meaning in _MEANINGS.items():
        if words in text:
            text = meaning
    frame = _innermost_outside_torch(exc)
    if frame is None:
        return text
    line = frame.line or linecache.getline(frame.filename, frame.lineno or 0).strip()
    return f"{text}, at {_short(frame.filename)}:{frame.lineno} (`{line}`)"


def _innermost_outside_torch(exc: BaseException) -> traceback.FrameSummary | None:
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not any(p in f.filename for p in _OURS)
    ]
    return frames[-1] if frames else None
