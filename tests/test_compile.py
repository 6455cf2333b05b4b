"""torch.compile readiness (report.compile, rule compile-graph-break): Dynamo's graphs and
breaks with the user's line, recompiles per named dim, fake mode, healthy models quiet."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from inspector.context import Inputs, Options
from inspector.health.adhoc import context_for
from inspector.passes import dynamo, findings


class Breaks(nn.Module):
    """`.item()` then `print` in forward: two graph breaks, three graphs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        scale = h.abs().sum().item()  # BREAK-ITEM
        print("scale", scale)  # BREAK-PRINT
        return self.b(h) * 2.0


class Healthy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x))) * 2.0


def _line(tag: str) -> int:
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if tag in text and "_line" not in text)


class _AtDims:
    """An input factory with one named dim B (the first axis of x)."""

    def __init__(self, batch: int, fake_mode: object = None) -> None:
        self.batch = batch

    def build(self, dims: dict[str, int] | None = None, device: str = "cpu") -> Inputs:
        b = (dims or {}).get("B", self.batch)
        return Inputs(args=(torch.randn(b, 4),), dims={"B": b})


def run(model: nn.Module, batch: int = 8, level: str = "fast", marked: bool = False):
    options = Options(compile=level)
    ctx = context_for(
        model, (torch.randn(batch, 4),), options=options, capture="hooks", user_files=[__file__]
    )
    ctx.factory = _AtDims(batch)
    ctx.inputs = ctx.factory.build()
    if marked:  # as torch.export with dynamic shapes leaves the capture stage's inputs
        torch._dynamo.mark_dynamic(ctx.inputs.args[0], 0)
    dynamo.run(ctx)
    findings.run(ctx)
    return ctx


def test_breaks_name_the_users_line_and_op() -> None:
    section = run(Breaks()).report.compile
    assert section.computed and section.error is None and section.mode == "train"
    # graph 1: a, abs, sum; graph 2 (after print): b, mul; the resumed frame between
    # them holds only `print` and has no graph
    assert (section.graph_break_count, section.graph_count) == (2, 2)
    sites = [(b.where, b.op, b.code) for b in section.breaks]
    assert sites == [
        (f"test_compile.py:{_line('BREAK-ITEM')}", "Tensor.item()",
         "scale = h.abs().sum().item()  # BREAK-ITEM"),
        (f"test_compile.py:{_line('BREAK-PRINT')}", "print",
         'print("scale", scale)  # BREAK-PRINT'),
    ]  # fmt: skip
    assert section.breaks[0].reason.startswith("Unsupported Tensor.item() call")
    assert section.breaks[0].url and section.breaks[0].hints


def test_each_break_is_a_warning_with_its_cure() -> None:
    found = [f for f in run(Breaks()).report.findings if f.rule == "compile-graph-break"]
    assert [(f.severity, f.where) for f in found] == [
        ("warning", f"test_compile.py:{_line('BREAK-ITEM')}"),
        ("warning", f"test_compile.py:{_line('BREAK-PRINT')}"),
    ]
    assert "`.item()`" in found[0].fix and "torch.cond" in found[0].fix
    assert "reorderable_logging_functions" in found[1].fix
    assert "scale = h.abs().sum().item()" in found[0].message


def test_a_break_inside_a_library_is_info() -> None:
    # none of the stack's frames in the user's files: a library's break, not theirs to fix
    ctx = context_for(Breaks(), (torch.randn(8, 4),), capture="hooks", user_files=["/lib.py"])
    dynamo.run(ctx)
    findings.run(ctx)
    found = [f for f in ctx.report.findings if f.rule == "compile-graph-break"]
    assert [f.severity for f in found] == ["info", "info"]
    assert "inside a library, not in your code" in found[0].message
    assert not any(b.in_user_code for b in ctx.report.compile.breaks)


def test_a_healthy_model_is_one_graph_without_findings() -> None:
    ctx = run(Healthy())
    section = ctx.report.compile
    # linear, relu, linear, mul: one graph, no break
    assert (section.graph_count, section.graph_break_count, section.breaks) == (1, 0, [])
    assert not [f for f in ctx.report.findings if f.rule == "compile-graph-break"]


def test_recompiles_per_named_dim_with_the_failed_guard() -> None:
    for level in ("fast", "all"):
        section = run(Healthy(), batch=8, level=level).report.compile
        # B: 8 -> 4 (inspector.graph.symdims.perturbed_value halves an even dim); the size
        # guard on x fails: fast stops there, all recompiles (once: B is then dynamic)
        [entry] = section.recompiles
        assert (entry.dim, entry.value, entry.changed_to, entry.recompiles) == ("B", 8, 4, 1)
        assert entry.counted == (level == "all") and entry.error is None
        assert "size mismatch at index 0. expected 8, actual 4" in entry.guards[0]
        assert entry.guards[0].startswith("forward in test_compile.py:")


def test_dims_an_earlier_export_marked_dynamic_are_not_inherited() -> None:
    section = run(Healthy(), batch=8, marked=True).report.compile
    # a user's fresh tensors carry no marks: B's change fails the guard on x in forward
    [entry] = section.recompiles
    assert entry.recompiles == 1 and entry.guards[0].startswith("forward in test_compile.py:")


def test_all_counts_the_frames_after_a_break_too() -> None:
    # Breaks: the forward and the frame resumed after `print` both see the batch dim
    # (the frame between, `print` alone, has no graph and no guards)
    fast = run(Breaks(), level="fast").report.compile.recompiles[0]
    full = run(Breaks(), level="all").report.compile.recompiles[0]
    assert (fast.recompiles, fast.counted) == (1, False)
    assert full.counted and full.recompiles > fast.recompiles, full.guards


def test_compile_none_skips_the_check() -> None:
    section = run(Breaks(), level="none").report.compile
    assert not section.computed and section.skipped == "not asked for (--compile none)"
    assert section.breaks == [] and section.graph_break_count is None


def test_dynamo_state_is_reset_after() -> None:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    compiled = torch.compile(Healthy(), backend="eager")
    compiled(torch.randn(2, 4))
    assert _debug_get_cache_entry_list(Healthy.forward.__code__)  # a compile leaves entries
    run(Breaks())
    # the check leaves no compiled code behind, neither its own nor anyone's before it
    assert _debug_get_cache_entry_list(Breaks.forward.__code__) == []
    assert _debug_get_cache_entry_list(Healthy.forward.__code__) == []


class PrintsShape(Healthy):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        print("h", h.shape)  # BREAK-SHAPE
        return self.b(h)


def _fake_run(make: type[nn.Module]):
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_mode:
        model, x = make(), torch.randn(8, 4)
    ctx = context_for(model, (x,), capture="fx", user_files=[__file__])
    ctx.fake_mode = fake_mode
    dynamo.run(ctx)
    return ctx.report.compile


def test_fake_mode_gives_the_real_breaks() -> None:
    real = run(PrintsShape()).report.compile
    fake = _fake_run(PrintsShape)
    assert fake.computed and fake.error is None
    assert [b.where for b in fake.breaks] == [f"test_compile.py:{_line('BREAK-SHAPE')}"]
    assert [(b.where, b.op) for b in fake.breaks] == [(b.where, b.op) for b in real.breaks]
    assert (fake.graph_count, fake.graph_break_count) == (real.graph_count, 1) == (2, 1)


def test_fake_mode_stops_at_a_value_read_and_keeps_its_break() -> None:
    # `.item()` breaks the graph, then runs in Python on a fake tensor, which has no value
    fake = _fake_run(Breaks)
    assert [b.op for b in fake.breaks] == ["Tensor.item()"]
    assert fake.error and "DataDependentOutputException" in fake.error
    assert fake.graph_count is None and fake.recompiles == []


def test_standard_models_have_no_graph_break() -> None:
    import models

    for make, config in [
        ("make_mlp", {}),
        ("make_resnet18", {}),
        ("make_gpt2", {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100}),
    ]:
        model, (args, kwargs) = getattr(models, make)(**config)
        ctx = context_for(model, args, kwargs, capture="hooks")
        dynamo.run(ctx)
        section = ctx.report.compile
        assert (section.computed, section.graph_count, section.breaks) == (True, 1, []), make


def _section_facts(section) -> tuple:  # noqa: ANN001
    return (
        section.computed, section.error, section.graph_count, section.op_count,
        [(b.where, b.op) for b in section.breaks],
        [(r.dim, r.value, r.changed_to, r.recompiles, r.guards, r.error)
         for r in section.recompiles],
    )  # fmt: skip


def _spied_checks(monkeypatch) -> list[tuple[object, bool]]:  # noqa: ANN001
    """One entry per Dynamo check the pass runs: (the model it ran, whether on fake inputs)."""
    from torch._subclasses.fake_tensor import FakeTensor

    runs: list[tuple[object, bool]] = []
    check = dynamo.check

    def spied(model, base, changed, count_all=False):  # noqa: ANN001, ANN202
        runs.append((model, isinstance(base.args[0], FakeTensor)))
        return check(model, base, changed, count_all=count_all)

    monkeypatch.setattr(dynamo, "check", spied)
    monkeypatch.setattr(dynamo, "_fake_is_cheaper", lambda ctx: True)
    return runs


def test_when_fake_is_cheaper_dynamo_runs_a_fake_copy_with_the_real_answer(monkeypatch) -> None:
    """A model whose real forward costs more than a fake one (the memory pass's two steps
    say so) is checked on a fake copy: the same graphs, breaks and guards as the real run,
    and no real forward."""
    for make in (Healthy, PrintsShape):
        real = run(make()).report.compile
        runs = _spied_checks(monkeypatch)
        model = make()
        fake = run(model).report.compile
        monkeypatch.undo()
        assert _section_facts(fake) == _section_facts(real)
        assert len(runs) == 1 and runs[0][0] is not model and runs[0][1], make.__name__
        assert real.recompiles[0].guards  # the changed batch fails a guard, named the same


def test_a_fake_copy_that_needs_a_value_is_checked_for_real(monkeypatch) -> None:
    """`.item()` stops the fake copy's run after its break: the check runs again on the
    model itself and reports what a real run does (two breaks, no error)."""
    real = run(Breaks()).report.compile
    runs = _spied_checks(monkeypatch)
    model = Breaks()
    fake_first = run(model).report.compile
    assert _section_facts(fake_first) == _section_facts(real)
    assert (real.error, real.graph_count, real.graph_break_count) == (None, 2, 2)
    assert [(m is model, on_fake) for m, on_fake in runs] == [(False, True), (True, False)]


def test_a_fake_copy_is_chosen_when_a_fake_step_costs_less_than_three_real_forwards() -> None:
    """The choice reads the memory pass's fake rerun and the forward the inputs-fit check
    timed at load, not the measured step, which runs beside this pass."""
    from types import SimpleNamespace

    def ctx(rerun: float, forward: float | None, on_fake: bool = True) -> SimpleNamespace:
        memory = SimpleNamespace(rerun_cost=rerun, on_fake=on_fake)
        return SimpleNamespace(results=SimpleNamespace(real_forward_seconds=forward, memory=memory))

    from inspector.realcost import REAL_STEP_FORWARDS, fake_step_is_cheaper

    assert REAL_STEP_FORWARDS == 3 and dynamo._fake_is_cheaper is fake_step_is_cheaper
    assert fake_step_is_cheaper(ctx(0.25, 0.1))  # 0.25 s < 3 x 0.1 s
    assert not fake_step_is_cheaper(ctx(0.35, 0.1))
    assert not fake_step_is_cheaper(ctx(0.01, None))  # a fake run: no real forward
    assert not fake_step_is_cheaper(ctx(0.01, 0.1, on_fake=False))  # a real-copy estimate


def test_dynamo_does_not_time_the_guards_it_makes(monkeypatch) -> None:
    """Timing a frame's guards flushes the CPU's caches (16 ms a frame) for a log line
    nothing reads: skipped during the check, Dynamo's own function back after it."""
    import torch._dynamo.guards as guards

    timed = []

    def counting(*args: object) -> float:
        timed.append(args)
        return 1.0

    monkeypatch.setattr(guards, "profile_guard_manager", counting)
    section = run(Breaks()).report.compile
    assert (section.graph_break_count, section.graph_count) == (2, 2)
    assert timed == [] and guards.profile_guard_manager is counting
    # the counting stand-in is what Dynamo calls outside the check
    torch._dynamo.reset()
    torch.compile(Healthy(), backend="eager")(torch.randn(2, 4))
    torch._dynamo.reset()
    assert len(timed) == 1


@functools.lru_cache
def _cached_scale() -> float:
    return 2.0


class Cached(nn.Module):
    """Calls a cached function and warns of its own in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        warnings.warn("the model's own warning", UserWarning, stacklevel=1)
        return self.a(x) * _cached_scale()  # CACHED-CALL


def test_dynamos_warnings_are_the_sections_notes_and_the_models_own_stay_warnings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Dynamo warns (once per process) that it traces through an lru_cache wrapper: that
    is about the model's compile, so the report says it, each time it is checked; the
    model's own warning reaches the user once a check, as in a plain call (the sample's
    and the changed dim's runs would show it twice)."""
    for _ in range(2):  # the second check has the note too: Dynamo's reset forgets it warned
        ctx = run(Cached())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dynamo.run(ctx)
        section = ctx.report.compile
        assert section.graph_break_count == 1  # Dynamo breaks at `warnings.warn`
        [note] = section.notes
        where = f"{Path(__file__).name}:{_line('CACHED-CALL')}"
        assert note.startswith("Dynamo detected a call to a `functools.lru_cache`-wrapped")
        assert f"at '{where}'" in note and "This call originates from" not in note
        assert [str(w.message) for w in caught] == ["the model's own warning"]
    assert "lru_cache" not in capsys.readouterr().err
    findings.run(ctx)
    assert not [f for f in ctx.report.findings if "lru_cache" in f.message]  # a note only
