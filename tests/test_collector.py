"""The cycle collector during an analysis: what existed before it is out of sight until
it is done (inspector/analyze.py `_earlier_objects_frozen`), then collectable again."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

import inspector.analyze as analyze
from inspector.analyze import inspect_model
from inspector.context import Options

MLP = str(Path(__file__).resolve().parent.parent / "examples" / "mlp.py") + ":Net"


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _watch_capture(monkeypatch: pytest.MonkeyPatch, marker: weakref.ref) -> list[bool]:
    """Whether `marker()` is alive and out of the collector's sight when the capture
    stage starts (a frozen object is in no generation)."""
    seen: list[bool] = []
    capture = analyze.capture_graph

    def watched(ctx):  # noqa: ANN001, ANN202
        alive = marker()
        seen.append(alive is not None and not any(o is alive for o in gc.get_objects()))
        return capture(ctx)

    monkeypatch.setattr(analyze, "capture_graph", watched)
    return seen


def test_earlier_objects_are_frozen_during_the_analysis_and_collected_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert gc.get_freeze_count() == 0
    cycle = _Cycle()
    gone = weakref.ref(cycle)
    seen = _watch_capture(monkeypatch, gone)
    inspect_model(MLP, None, Options(passes={"graph"}, isolate=False))
    assert seen == [True]  # there, and out of the collector's sight
    assert gc.get_freeze_count() == 0  # nothing left frozen: the caller collects it all
    del cycle  # garbage now: only a collection frees it
    gc.collect()
    assert gone() is None


def test_a_caller_that_froze_objects_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    gc.freeze()
    try:
        marker = _Cycle()  # made after the caller's freeze: the analysis freezes nothing
        seen = _watch_capture(monkeypatch, weakref.ref(marker))
        inspect_model(MLP, None, Options(passes={"graph"}, isolate=False))
        assert seen == [False]
        assert gc.get_freeze_count() > 0  # the caller's freeze stands
    finally:
        gc.unfreeze()
