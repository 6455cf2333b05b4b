"""Run the model through torch.compile's front end (Dynamo) with backends that only
collect graphs and run them eagerly: no Inductor, so it costs about one traced forward
per graph. Dynamo's caches are reset after each use, so nothing leaks into the next pass
or the user's own compile."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
import torch._dynamo as dynamo
import torch._dynamo.convert_frame as convert_frame
import torch._dynamo.symbolic_convert as symbolic_convert

from inspector.context import Inputs

__all__ = ["Explained", "explain", "GuardFailure", "recompiles_at", "quiet"]


@dataclass
class Explained:
    graph_count: int | None
    graph_break_count: int
    op_count: int | None
    break_reasons: list[Any]  # torch._dynamo's GraphCompileReason, or _Break
    error: BaseException | None = None  # the run stopped: the breaks are those before it


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Dynamo logs every break as a warning and the model may print: the report is the
    place for both, and `--json -` must keep stdout clean."""
    logger = logging.getLogger("torch._dynamo")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


@dataclass
class _Break:
    """A break as Dynamo logs it (the shape of explain's GraphCompileReason)."""

    reason: str
    user_stack: list[Any]


def explain(model: Callable[..., Any], inputs: Inputs) -> Explained:
    """torch._dynamo.explain on one call of `model`, then Dynamo's state reset.

    explain's own list keeps a break only when a graph was compiled before it, so a
    `print` right after another break goes missing: every break Dynamo logs is recorded
    too, and that fuller list wins when there is one."""
    logged: list[_Break] = []
    original = symbolic_convert.InstructionTranslatorBase.log_graph_break

    def record(self: Any, code_options: Any, reason: str, exc: Any) -> None:
        if not getattr(exc, "logged", False):
            stack = getattr(exc, "real_stack", None)
            if stack is None:
                stack = torch._guards.TracingContext.extract_stack()
            logged.append(_Break(str(reason), list(stack or ())))
        original(self, code_options, reason, exc)

    patch = mock.patch.object(symbolic_convert.InstructionTranslatorBase, "log_graph_break", record)
    try:
        with quiet(), patch:
            out = dynamo.explain(model)(*inputs.args, **inputs.kwargs)
    except Exception as exc:  # noqa: BLE001 - e.g. `.item()` run on a fake tensor after its break
        if not logged:
            raise
        return Explained(None, len(logged), None, logged, error=exc)
    finally:
        dynamo.reset()
    breaks = logged if len(logged) > len(out.break_reasons) else list(out.break_reasons)
    return Explained(out.graph_count, len(breaks), out.op_count, breaks)


@dataclass
class GuardFailure:
    code: str  # "forward in model.py:12"
    reasons: list[str] = field(default_factory=list)


def recompiles_at(
    model: Callable[..., Any], base: Inputs, changed: list[Inputs]
) -> list[tuple[list[GuardFailure], str | None]]:
    """Compile `model` on `base`, then call it on each of `changed` in turn; for each,
    the frames Dynamo compiled again with the guards that failed, and the error of a run
    that raised. Each run starts from the state the previous ones left (a dim made
    dynamic stays dynamic), as in a training loop."""
    failures: list[GuardFailure] = []
    original = convert_frame.get_and_maybe_log_recompilation_reasons

    def record(cache_entries: Any, frame: Any, *args: Any, **kwargs: Any) -> list[str]:
        reasons = original(cache_entries, frame, *args, **kwargs)
        code = frame.f_code
        where = f"{code.co_name} in {code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}"
        failures.append(GuardFailure(where, list(reasons)))
        return reasons

    compiled = torch.compile(model, backend="eager")
    out: list[tuple[list[GuardFailure], str | None]] = []
    patch = mock.patch.object(convert_frame, "get_and_maybe_log_recompilation_reasons", record)
    try:
        with quiet(), patch:
            compiled(*base.args, **base.kwargs)
            for inputs in changed:
                failures.clear()
                error = None
                try:
                    compiled(*inputs.args, **inputs.kwargs)
                except Exception as exc:  # noqa: BLE001 - the model's own failure is the answer
                    lines = str(exc).strip().splitlines() or [""]
                    error = f"{type(exc).__name__}: {lines[0][:300]}"
                out.append((list(failures), error))
    finally:
        dynamo.reset()
    return out
