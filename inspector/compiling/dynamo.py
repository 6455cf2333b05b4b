"""Run the model through torch.compile's front end (Dynamo) with a backend that only counts
the graphs and runs them eagerly: no Inductor, so it costs one traced forward per graph.
One compiled model serves the sample and then each changed input (the recompiles), and
Dynamo's caches are reset after, so nothing leaks into a later pass or the user's own
compile.

What torch._dynamo.explain reports is gathered the same way it does (a counting backend),
but its list of breaks keeps one only when a graph was compiled before it (a `print` right
after another break goes missing), so each break is recorded as Dynamo logs it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
import torch._dynamo as dynamo
import torch._dynamo.convert_frame as convert_frame
import torch._dynamo.symbolic_convert as symbolic_convert

from inspector.context import Inputs
from inspector.torchfakerules import rules_in_torch_modes

__all__ = ["Break", "GuardFailure", "Checked", "check", "quiet", "dynamo_warnings"]


class _Stop(Exception):
    """Raised where Dynamo would recompile, when only the first failed guard is wanted."""


_OPS = ("call_function", "call_method", "call_module")


@dataclass
class Break:
    """A graph break as Dynamo logs it (the shape of explain's GraphCompileReason)."""

    reason: str
    user_stack: list[Any]


@dataclass
class GuardFailure:
    code: str  # "forward in model.py:12"
    reasons: list[str] = field(default_factory=list)


@dataclass
class Checked:
    graph_count: int | None  # None when the sample's run stopped
    op_count: int | None
    breaks: list[Break]
    # per changed input: the frames compiled again, and the error of a run that raised
    recompiles: list[tuple[list[GuardFailure], str | None]] = field(default_factory=list)
    error: BaseException | None = None  # the sample's run stopped after its last break
    notes: list[str] = field(default_factory=list)  # Dynamo's own warnings, first paragraphs


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


class _Recorder:
    """Patches Dynamo's two reporting points for the duration: breaks, failed guards."""

    def __init__(self) -> None:
        self.stop_at_recompile = False  # record the first failed guard, then stop the run
        self.breaks: list[Break] = []
        self.failures: list[GuardFailure] = []
        self.ops_per_graph: list[int] = []

    def backend(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        self.ops_per_graph.append(sum(1 for n in gm.graph.nodes if n.op in _OPS))
        return gm.forward  # run the graph eagerly, as backend="eager" does

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        log_break = symbolic_convert.InstructionTranslatorBase.log_graph_break
        reasons = convert_frame.get_and_maybe_log_recompilation_reasons

        def on_break(translator: Any, code_options: Any, reason: str, exc: Any) -> None:
            if not getattr(exc, "logged", False):  # Dynamo logs a break once
                stack = getattr(exc, "real_stack", None)
                if stack is None:
                    stack = torch._guards.TracingContext.extract_stack()
                self.breaks.append(Break(str(reason), list(stack or ())))
            log_break(translator, code_options, reason, exc)

        def on_recompile(cache_entries: Any, frame: Any, *args: Any, **kwargs: Any) -> list[str]:
            found = reasons(cache_entries, frame, *args, **kwargs)
            code = frame.f_code
            name = code.co_filename.rsplit("/", 1)[-1]
            self.failures.append(GuardFailure(f"{code.co_name} in {name}:{code.co_firstlineno}",
                                              list(found)))  # fmt: skip
            if self.stop_at_recompile:
                raise _Stop  # no recompile: tracing again costs as much as the first compile
            return found

        translator = symbolic_convert.InstructionTranslatorBase
        recompile_reasons = "get_and_maybe_log_recompilation_reasons"
        with (
            mock.patch.object(translator, "log_graph_break", on_break),
            mock.patch.object(convert_frame, recompile_reasons, on_recompile),
            _guards_not_timed(),
        ):
            yield


_DYNAMO_FILES = f"{torch._dynamo.__path__[0]}/"  # noqa: SLF001 - where its warnings come from
_NOTE_CHARS = 600


@contextlib.contextmanager
def dynamo_warnings(notes: list[str]) -> Iterator[None]:
    """Dynamo's own warnings while it traces ("Dynamo detected a call to a
    `functools.lru_cache`-wrapped function at 'modeling_mamba.py:245' ... Silent
    incorrectness is only a *potential* risk") are about the model's compile: each goes
    into `notes` once (the first paragraph: the rest is its stack), not to stderr. Any
    other warning (the model's own) is shown once, as it would have been."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        shown: set[tuple[str, type[Warning], str, int]] = set()
        for item in caught:
            if item.filename.startswith(_DYNAMO_FILES):
                text = str(item.message).strip().split("\n\n", 1)[0].strip()[:_NOTE_CHARS]
                if text and text not in notes:
                    notes.append(text)
                continue
            key = (str(item.message), item.category, item.filename, item.lineno)
            if key not in shown:
                shown.add(key)
                warnings.warn_explicit(item.message, item.category, item.filename, item.lineno)


def _guards_not_timed() -> contextlib.AbstractContextManager[Any]:
    """Dynamo times each frame's new guards for its metrics log, flushing the CPU's caches
    first: 16 ms a frame, 0.6 s of a detector's 9 s check (39 frames). Nothing here reads
    that time."""
    guards = getattr(dynamo, "guards", None)
    if guards is None or not hasattr(guards, "profile_guard_manager"):
        return contextlib.nullcontext()
    return mock.patch.object(guards, "profile_guard_manager", lambda *args, **kwargs: 0.0)


def check(
    model: Callable[..., Any], base: Inputs, changed: list[Inputs], count_all: bool = False
) -> Checked:
    """Compile `model`, call it on `base`, then on each of `changed` in turn.

    count_all: each changed run recompiles where Dynamo does, and every frame compiled
    again is counted; each run starts from the state the previous ones left (a dim made
    dynamic stays dynamic), as in a training loop. Else each changed run stops at the
    first frame whose guards fail (one failure at most, no recompile, the cost of a guard
    check) and is judged against the sample's compile alone."""
    rec = _Recorder()
    # As a fresh process would: an earlier torch.export or compile in this one leaves
    # Dynamo's per-code state (dims it already made dynamic) behind.
    dynamo.reset()
    compiled = torch.compile(model, backend=rec.backend)
    notes: list[str] = []
    try:
        with quiet(), dynamo_warnings(notes), rec.patched(), rules_in_torch_modes():
            try:
                compiled(*base.args, **base.kwargs)
            except Exception as exc:  # noqa: BLE001 - e.g. `.item()` on a fake tensor after its break
                if not rec.breaks:
                    raise
                return Checked(None, None, list(rec.breaks), error=exc, notes=notes)
            done = Checked(len(rec.ops_per_graph), sum(rec.ops_per_graph), list(rec.breaks))
            done.notes = notes  # the same list: the changed runs' warnings join it
            rec.stop_at_recompile = not count_all
            for inputs in changed:
                rec.failures.clear()
                error = _call(compiled, inputs)
                stopped = not count_all and bool(rec.failures)  # our _Stop, maybe wrapped
                done.recompiles.append((list(rec.failures), None if stopped else error))
    finally:
        dynamo.reset()
    return done


def _call(compiled: Callable[..., Any], inputs: Inputs) -> str | None:
    try:
        compiled(*inputs.args, **inputs.kwargs)
    except Exception as exc:  # noqa: BLE001 - the model's own failure is the answer
        lines = str(exc).strip().splitlines() or [""]
        return f"{type(exc).__name__}: {lines[0][:300]}"
    return None
