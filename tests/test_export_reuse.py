"""The export pass runs the eager model once per input set, whatever the number of
targets it compares with it (issue #17: no pass repeats a forward it already ran)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_export import BatchFactory
from torch import nn

from inspector.context import Context, InputFactory, Inputs, LoadedModel, Options
from inspector.health import exportmatch
from inspector.health.exportmatch import EagerOutputs
from inspector.passes import export, modes
from inspector.report import Report


class Counted(nn.Module):
    """Counts its eager forwards: real tensors, outside tracing (jit.trace's own check,
    which the pass turns off, would call forward once more on real tensors)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 4)
        self.bn = nn.BatchNorm1d(4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():  # a scripted forward runs no Python
            self._count(x)
        return self.bn(self.fc(x))

    @torch.jit.unused
    def _count(self, x: torch.Tensor) -> None:
        if type(x) is torch.Tensor and not torch.jit.is_tracing():
            self.calls += 1


def _ctx(model: nn.Module, export_level: str = "fast") -> Context:
    loaded = LoadedModel(model, "python", "test_export_reuse.py")
    inputs = Inputs((torch.randn(3, 8),), {})
    return Context(loaded, InputFactory(), inputs, Options(export=export_level), Report())


def test_eager_outputs_run_once_per_input_set_in_eval_mode() -> None:
    model = Counted()
    ctx = _ctx(model)
    eager = EagerOutputs(ctx)
    first = eager.of(ctx.inputs)
    again = eager.of(ctx.inputs)
    assert model.calls == 1
    assert again is first
    with torch.no_grad():  # the independent answer: an eval forward by hand
        expected = model.eval()(ctx.inputs.args[0])
    model.train()
    assert torch.equal(first[0], expected)
    other = Inputs((torch.randn(5, 8),), {})  # another input set is run on its own
    assert eager.of(other)[0].shape == (5, 4)
    assert model.calls == 3  # the by-hand forward above counted too


def test_export_pass_compares_every_target_with_one_eager_run() -> None:
    model = Counted()
    ctx = _ctx(model, export_level="all")
    export.run(ctx)
    targets = {t.target: t for t in ctx.report.export.targets}
    run = {"export-nonstrict", "export-strict", "torchscript-script", "torchscript-trace"}
    assert run <= set(targets)
    checked = [targets[name] for name in run]
    assert all(t.ok and t.checked == ["sample"] and t.mismatch is None for t in checked)
    # the sample has no named dims: one eager run for every comparison (one per target,
    # and one more from jit.trace's own check, before; strict export and the ONNX
    # exporter trace on fake tensors, which `Counted` does not count)
    assert model.calls == 1
    assert model.training  # the pass leaves the model's mode as it found it


def _batched(model: nn.Module) -> Context:
    factory = BatchFactory(6)
    loaded = LoadedModel(model, "python", "test_export_reuse.py")
    return Context(loaded, factory, factory.build(), Options(), Report())


def _counting_exports(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each torch.export.export call's `dynamic_shapes is not None`, in order."""
    calls: list[bool] = []
    real = torch.export.export

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(kwargs.get("dynamic_shapes") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", counted)
    return calls


def test_the_nonstrict_target_is_the_dynamic_export_when_it_exports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counting_exports(monkeypatch)
    ctx = _batched(Counted())
    export.run(ctx)
    target = next(t for t in ctx.report.export.targets if t.target == "export-nonstrict")
    # one export, with B dynamic, for the verdict, the sample and B=3 (two before)
    assert calls == [True]
    assert target.ok and target.checked == ["sample", "B=3"] and target.mismatch is None
    with torch.no_grad():  # the independent answer: the eval forward by hand
        expected = ctx.model.eval()(ctx.inputs.args[0])
    assert target.max_abs_diff < 1e-6 * float(expected.abs().max())


def test_a_failing_dynamic_export_leaves_the_verdict_to_the_static_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(*args: object, **kwargs: object) -> object:
        raise RuntimeError("no dynamic program here")

    monkeypatch.setattr(exportmatch, "export_graph", refused)
    calls = _counting_exports(monkeypatch)
    ctx = _batched(Counted())
    export.run(ctx)
    target = next(t for t in ctx.report.export.targets if t.target == "export-nonstrict")
    assert calls == [False]  # the static export, after the refused dynamic one
    assert target.ok and target.checked == ["sample", "B=3"]
    assert target.mismatch == "B=3: fails: RuntimeError: no dynamic program here"


def test_the_export_checks_compare_the_sample_with_the_modes_eval_run() -> None:
    model = Counted()
    ctx = _batched(model)
    modes.run(ctx)
    assert model.calls == 2  # eval(), then train(): the model draws nothing at random
    export.run(ctx)
    # eager ran once more, at B=3 only: the sample's eager output is modes' eval() run
    assert model.calls == 3
    nonstrict = ctx.report.export.targets[0]
    assert nonstrict.checked == ["sample", "B=3"] and nonstrict.max_abs_diff < 1e-6


def _widened(a: torch.Tensor, b: torch.Tensor) -> float:
    """The definition: both widened to float64, NaN kept (it fails no threshold)."""
    return float((a.double() - b.double()).abs().max())


def test_the_exported_difference_is_the_float64_one_bit_for_bit() -> None:
    """float32 outputs are compared in float32, then in float64 near the largest
    difference; the answer must be the widened one exactly, NaN and Inf included."""
    import math

    g = torch.Generator().manual_seed(0)
    base = torch.randn(4096, generator=g)
    cases = [
        (base, base.clone()),
        (base * 1e6, base * 1e6 + torch.randn(4096, generator=g)),  # rounding in float32
        (base, base * 3.0 - 1e-3),
        (torch.full((8,), 1e30), torch.full((8,), -1e-30)),  # exponents 200 bits apart
        (torch.full((8,), 1e-40), torch.zeros(8)),  # a subnormal difference
        (torch.tensor([16777216.0, 16777218.0]), torch.tensor([-1.0, 1.0])),  # a float32 tie
        (torch.tensor([3e38, 1.0]), torch.tensor([-3e38, 1.0])),  # overflows in float32
        (torch.tensor([1.0, float("inf")]), torch.tensor([0.5, 0.0])),
        (base.bfloat16(), (base * 2).bfloat16()),  # other dtypes are widened as before
    ]
    for a, b in cases:
        assert exportmatch._max_abs_diff(a, b) == _widened(a, b)
    nan = exportmatch._max_abs_diff(torch.tensor([1.0, float("nan")]), torch.tensor([0.5, 0.0]))
    assert math.isnan(nan) and math.isnan(_widened(torch.tensor([float("nan")]), torch.zeros(1)))


class ReturnsItsBuffer(nn.Module):
    """Writes each call's result into a buffer it returns (a static KV cache does so)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("out", torch.zeros(3, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.out.copy_(x[:, :4] * 2.0)
        return self.out


def test_eager_outputs_kept_do_not_follow_the_models_next_call() -> None:
    model = ReturnsItsBuffer()
    ctx = _ctx(model)
    kept = EagerOutputs(ctx).of(ctx.inputs)[0]
    assert torch.equal(kept, ctx.inputs.args[0][:, :4] * 2.0)
    model(torch.ones(3, 8))  # the next call writes over the buffer it returned
    assert torch.equal(kept, ctx.inputs.args[0][:, :4] * 2.0)


class DrawsInEval(nn.Module):
    """Adds a random draw in eval() too: its eval output is the seeded one only."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + torch.rand(4)


_SPEC = '{"x": {"shape": ["B", 8]}, "dims": {"B": 6}}'


def test_the_load_check_is_the_seeded_eval_run_the_export_checks_compare_with() -> None:
    """The input check's eval() forward (inspector/analyze.py) is kept for the export
    checks: run beside the others they would not have the modes pass's."""
    from inspector.analyze import _load
    from inspector.fit import check_inputs_fit

    options = Options(seed=7)
    loaded, _, inputs, _, _, check = _load(
        "tests/test_export_reuse.py:DrawsInEval", _SPEC, options, None, Report()
    )
    kept = check.eval_output
    assert kept[0] is inputs
    with torch.no_grad():  # the independent answer: the seeded eval forward by hand
        torch.manual_seed(7)
        expected = inputs.call(loaded.model.eval())
    assert torch.equal(kept[1][0], expected)
    ctx = Context(loaded, InputFactory(), inputs, options, Report())
    ctx.results.eval_output = kept
    assert torch.equal(EagerOutputs(ctx).of(inputs)[0], expected)
    # the seeded check leaves the generator as it found it: its draw was in a fork
    state, outputs = torch.get_rng_state(), []
    check_inputs_fit(loaded.model, inputs, [], 7, outputs.append)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(outputs[0], expected)


def test_the_load_check_runs_the_sample_once_for_the_export_pass() -> None:
    from inspector.analyze import _load

    loaded, factory, inputs, _, _, check = _load(
        "tests/test_export_reuse.py:Counted", _SPEC, Options(), None, Report()
    )
    kept = check.eval_output
    model = loaded.model
    assert model.calls == 1  # the check
    ctx = Context(loaded, factory, inputs, Options(), Report())
    ctx.results.eval_output = kept
    export.run(ctx)
    assert model.calls == 2  # eager at B=3 only: the sample's is the check's
    nonstrict = ctx.report.export.targets[0]
    assert nonstrict.checked == ["sample", "B=3"] and nonstrict.max_abs_diff < 1e-6


def test_large_or_unwanted_check_outputs_are_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept where no larger than the weights (or small): `Counted` holds 36 + 8 floats."""
    import inspector.analyze as analyze

    ref = "tests/test_export_reuse.py:Counted"

    def kept(spec: str, options: Options) -> Any:
        return analyze._load(ref, spec, options, None, Report())[5].eval_output

    assert kept(_SPEC, Options(export="none")) is None
    assert kept(_SPEC, Options(passes={"graph"})) is None
    monkeypatch.setattr(analyze, "_KEPT_OUTPUT_BYTES", 0)  # the weights' 176 bytes decide
    spec = '{"x": {"shape": ["B", 8]}, "dims": {"B": %d}}'
    assert kept(spec % 12, Options()) is None  # [12, 4]
    assert kept(spec % 11, Options()) is not None  # [11, 4]
    monkeypatch.setattr(analyze, "_KEPT_OUTPUT_BYTES", 12 * 4 * 4)  # small is kept
    assert kept(spec % 12, Options()) is not None


class SeesCollector(nn.Module):
    """Notes whether the cycle collector is on during each of its forwards."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.collector: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import gc

        self.collector.append(gc.isenabled())
        return self.fc(x)


def test_the_timed_check_runs_without_the_collector_and_without_its_recording(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check's forward decides what runs beside what (inspector/realcost.py), as its
    seconds against the fake rerun's, which runs with the collector off: a collection of
    earlier garbage falling into it made it seven times as long. The copies modes'
    recording makes are not the forward's time either."""
    import gc
    import time

    from inspector.analyze import _load
    from inspector.passes.modes import EvalRecorder

    keep = EvalRecorder._keep

    def slow_keep(self, path, k, value):  # noqa: ANN001, ANN202
        time.sleep(0.1)  # a dear copy: the recording's time, not the forward's
        return keep(self, path, k, value)

    monkeypatch.setattr(EvalRecorder, "_keep", slow_keep)
    assert gc.isenabled()
    loaded, _, _, _, seconds, check = _load(
        "tests/test_export_reuse.py:SeesCollector", _SPEC, Options(), None, Report()
    )
    assert loaded.model.collector == [False] and gc.isenabled()
    recorder = check.modes_eval
    assert [(path, k) for path, k, _ in recorder.calls] == [("fc", 0), ("", 0)]
    assert recorder.finished and recorder.seconds >= 0.2  # two calls recorded
    assert 0 < seconds < 0.1
