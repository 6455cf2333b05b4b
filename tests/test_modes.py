"""Train vs eval: mode-dependent modules, divergence, BatchNorm checks, state restored."""

from __future__ import annotations

import pytest
import torch
from models import make_mlp, make_small_cnn
from test_rules import Training
from torch import nn

from inspector.context import Options
from inspector.health.adhoc import context_for
from inspector.health.modecheck import reads_training
from inspector.health.state import rng_watched
from inspector.passes import modes


def run(model: nn.Module, *args, **kw):
    ctx = context_for(model, args, **kw)
    modes.run(ctx)
    return ctx


def test_small_cnn_divergence_and_restore() -> None:
    model, (args, _) = make_small_cnn()
    model.eval()
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    rng = torch.get_rng_state()
    ctx = run(model, *args)
    section = ctx.report.modes
    assert section.computed
    assert section.mode_dependent_modules == ["features.1", "features.5", "dropout"]
    # the first BatchNorm normalises with batch stats in train(), running stats in eval()
    assert section.first_divergent_node == "features_1"
    assert section.output_max_abs_diff > 0
    conv = next(n for n in ctx.report.nodes if n.name == "features_0")
    assert conv.mode_divergence == 0.0  # conv is the same in both modes
    # restored: eval mode, running stats and RNG untouched by the pass
    assert not any(m.training for m in model.modules())
    assert all(torch.equal(v, buffers[k]) for k, v in model.named_buffers())
    assert torch.equal(torch.get_rng_state(), rng)


def test_divergence_equals_direct_comparison() -> None:
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), torch.randn(16, 4)
    section = run(model, x).report.modes
    with torch.no_grad():
        evaluated = model.eval()(x)  # before train(), which moves the running stats
        expected = (model.train()(x) - evaluated).abs().max().item()
    assert section.output_max_abs_diff == pytest.approx(expected, rel=1e-6)
    assert section.first_divergent_node == "_1"


def test_no_divergence_without_mode_dependent_modules() -> None:
    model, (args, _) = make_mlp(batch=4)
    section = run(model, *args).report.modes
    assert section.mode_dependent_modules == []
    assert section.output_max_abs_diff == 0.0 and section.first_divergent_node is None


def test_reads_training_detects_custom_modules() -> None:
    assert reads_training(Training) and not reads_training(nn.Linear)
    assert run(Training(), torch.randn(2, 4)).report.modes.mode_dependent_modules == [""]


def test_batchnorm_with_one_value_per_channel() -> None:
    for model, x in [
        (nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8)), torch.randn(1, 4)),
        (nn.Sequential(nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8)), torch.randn(1, 3, 1, 1)),
    ]:
        model.eval()  # fine in eval, fails in train
        ctx = run(model, x)
        bn = ctx.results.batchnorm_inputs["1"]
        assert bn.values_per_channel == 1 and bn.shape[0] == 1
        assert "Expected more than 1 value per channel" in ctx.report.modes.error
        assert not model.training  # mode restored after the failing train() run


def test_values_per_channel() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8))
    ctx = run(model, torch.randn(2, 3, 3, 5))
    assert ctx.results.batchnorm_inputs["1"].values_per_channel == 2 * 3 * 5


def test_fake_mode_is_skipped() -> None:
    section = run(Training(), torch.randn(2, 4), options=Options(fake=True)).report.modes
    assert not section.computed and "fake" in section.error
    assert section.mode_dependent_modules == [""]  # structural: still listed


class _Counted(nn.Module):
    """Counts its forwards; `noise` adds F.dropout with training=True in every mode."""

    def __init__(self, noise: bool) -> None:
        super().__init__()
        self.noise, self.calls = noise, 0
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.fc(x)
        return nn.functional.dropout(y, 0.5, training=True) if self.noise else y


@pytest.mark.parametrize("noise", [False, True])
def test_the_reseeded_eval_run_only_when_eval_draws_random_numbers(noise: bool) -> None:
    model = _Counted(noise)
    ctx = context_for(model, (torch.randn(8, 4),))
    model.calls = 0  # the capture's forwards
    modes.run(ctx)
    section = ctx.report.modes
    # eval, then eval reseeded only if eval drew from the seeded generator, then train
    assert model.calls == (3 if noise else 2)
    assert section.computed and (section.eval_max_abs_diff > 0) is noise
    assert (section.eval_first_differing_node is not None) is noise


def test_rng_watched_sees_draws_from_the_default_generator_only() -> None:
    with rng_watched() as quiet:
        torch.zeros(3).add_(1)
    with rng_watched() as noisy:
        torch.rand(3)
    own = torch.Generator().manual_seed(0)
    with rng_watched() as private:
        torch.rand(3, generator=own)  # a model's own generator: `seeded` cannot reseed it
    assert (quiet.drew, noisy.drew, private.drew) == (False, True, False)


class _BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Linear(8 * 8 * 8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1))


def test_the_gradients_forward_is_the_train_run_modes_compares() -> None:
    """A model in train() mode, seeded, on the sample: the gradients pass's forward is
    modes' train() run. Modes takes its recording and runs only eval(); the comparison
    and the BatchNorm inputs equal those of modes' own train() run."""
    from inspector.passes import gradients

    torch.manual_seed(0)
    model, x = _BatchNormNet(), torch.randn(4, 3, 8, 8)
    alone = context_for(model, (x,), options=Options(passes={"modes"}))
    shared = context_for(model, (x,), options=Options(passes={"gradients", "modes"}))
    gradients.run(shared)
    assert shared.results.modes_train is not None
    convs: list[int] = []
    model.body[0].register_forward_hook(lambda *args: convs.append(1))
    modes.run(shared)
    assert len(convs) == 1  # eval() only: eval drew nothing, the train() run was recorded
    modes.run(alone)
    assert len(convs) == 3  # eval() and train() of its own
    a, b = shared.report.modes, alone.report.modes
    assert a.computed and b.computed
    assert a.output_max_abs_diff == b.output_max_abs_diff > 0  # BatchNorm: batch vs running
    assert a.first_divergent_node == b.first_divergent_node is not None
    assert [n.mode_divergence for n in shared.report.nodes] == [
        n.mode_divergence for n in alone.report.nodes
    ]
    assert shared.results.batchnorm_inputs == alone.results.batchnorm_inputs != {}
    # a model left in eval() is not trained by the gradients forward: modes runs its own
    model.eval()
    kept = context_for(model, (x,), options=Options(passes={"gradients", "modes"}))
    gradients.run(kept)
    assert kept.results.modes_train is None


def _widened_max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The definition: every value widened to float64, NaN as 0, Inf as float64's max."""
    return (a.double() - b.double()).abs().nan_to_num(0.0).max().item()


def test_the_float32_max_difference_is_the_float64_one_bit_for_bit() -> None:
    """modes compares float32 nodes in float32 and widens only the near-largest
    differences: the answer must be the widened one exactly, where float32 rounds."""
    from inspector.passes.modes import _max_diff

    g = torch.Generator().manual_seed(0)
    base = torch.randn(4096, generator=g)
    cases = [
        (base, base.clone()),  # equal: 0.0
        (base, base + 1e-7 * torch.randn(4096, generator=g)),  # BatchNorm-small differences
        (base * 1e6, base * 1e6 + torch.randn(4096, generator=g)),  # rounding in float32
        (base, base * 3.0 - 1e-3),  # large differences, each rounded in float32
        (torch.full((8,), 1e30), torch.full((8,), -1e-30)),  # exponents 200 bits apart
        (torch.full((8,), 1e-40), torch.zeros(8)),  # a subnormal difference
        (torch.tensor([1.0, float("nan"), 2.0]), torch.tensor([0.5, 0.0, 2.0])),  # NaN as 0
        (torch.tensor([1.0, float("inf")]), torch.tensor([0.5, 0.0])),  # Inf as the max
        (torch.tensor([3e38, 1.0]), torch.tensor([-3e38, 1.0])),  # overflows in float32
    ]
    for a, b in cases:
        assert _max_diff(a, b) == _widened_max_diff(a, b)
    # two elements whose float32 differences tie but whose exact ones do not
    a = torch.tensor([16777216.0, 16777218.0])  # 2**24 and 2**24 + 2
    b = torch.tensor([-1.0, 1.0])  # exact: 2**24 + 1 (rounds to 2**24 in float32), 2**24 + 1
    assert _max_diff(a, b) == _widened_max_diff(a, b) == 16777217.0
    assert _max_diff(base, base.double()) == _widened_max_diff(base, base.double())  # mixed


class EvalDraws(nn.Module):
    """BatchNorm and dropout (mode-dependent), a module called twice, and a draw in
    eval() too (modes then reruns eval() reseeded)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
        self.shared = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.shared(torch.relu(self.shared(self.block(x))))
        return self.drop(h) + nn.functional.dropout(h, 0.1, training=True)


def test_the_load_check_is_modes_eval_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The load's input check is the seeded eval() forward modes runs first: recorded
    there, modes runs no eval() forward at the report's seed, and its section and every
    node's divergence equal those of modes' own eval() run."""
    import inspector.analyze as analyze
    from inspector.analyze import inspect_model

    evals: list[int | None] = []
    forward = modes._forward

    def counted(ctx, training, seed=None):  # noqa: ANN001, ANN202
        if not training:
            evals.append(seed)
        return forward(ctx, training, seed)

    monkeypatch.setattr(modes, "_forward", counted)
    ref, spec = "tests/test_modes.py:EvalDraws", '{"x": {"shape": ["B", 8]}, "dims": {"B": 16}}'
    options = {"passes": {"graph", "modes"}, "isolate": False, "seed": 3}
    recorded = inspect_model(ref, spec, Options(**options))
    assert evals == [4]  # the reseeded run only: eval() at seed 3 was the load's check
    monkeypatch.setattr(analyze, "records_eval", lambda options: False)
    evals.clear()
    own = inspect_model(ref, spec, Options(**options))
    assert evals == [None, 4]
    a, b = recorded.modes, own.modes
    assert a.computed and a.eval_max_abs_diff > 0 and a.first_divergent_node is not None
    assert a.model_dump() == b.model_dump()
    divergence = [(n.name, n.mode_divergence) for n in recorded.nodes]
    assert divergence == [(n.name, n.mode_divergence) for n in own.nodes]
    assert sum(d is not None for _, d in divergence) >= 5  # the module calls, both shared


def test_the_train_run_is_compared_as_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the load's eval() run recorded and the gradients pass's forward as the train()
    run, each train value is compared with the eval one as the forward makes it, none
    copied; the section and every node's divergence equal those modes works out from
    copies (here: its own eval() run, so the train values are copied)."""
    import inspector.analyze as analyze
    from inspector.analyze import inspect_model

    compares: list[str] = []
    compare = modes._Against.compare

    def counted(self, run, ref, value):  # noqa: ANN001, ANN202
        compares.append(ref.name)
        return compare(self, run, ref, value)

    monkeypatch.setattr(modes._Against, "compare", counted)
    ref, spec = "tests/test_modes.py:EvalDraws", '{"x": {"shape": ["B", 8]}, "dims": {"B": 16}}'
    options = Options(passes={"graph", "gradients", "modes"}, isolate=False, seed=3)
    compared = inspect_model(ref, spec, options)
    assert len(compares) >= 5  # every module call of the train() run
    monkeypatch.setattr(analyze, "records_eval", lambda options: False)
    compares.clear()
    own = inspect_model(ref, spec, options)
    assert compares == []  # modes' own eval() run: the train values were copied
    a, b = compared.modes, own.modes
    assert a.computed and a.output_max_abs_diff > 0 and a.first_divergent_node is not None
    assert a.model_dump() == b.model_dump()
    divergence = [(n.name, n.mode_divergence) for n in compared.nodes]
    assert divergence == [(n.name, n.mode_divergence) for n in own.nodes]
    assert sum(d is not None for _, d in divergence) >= 5


def test_a_train_run_compared_with_another_eval_run_is_not_used() -> None:
    """A train() run compared as it ran against the load's eval() run holds no values:
    where modes does not use that eval run (here: spent, and the BatchNorm's running
    stats changed since, so modes' own eval() run differs), it runs train() itself rather
    than report differences from another eval() run."""
    from inspector.health.state import preserved
    from inspector.passes import gradients

    torch.manual_seed(0)
    model, x = _BatchNormNet(), torch.randn(4, 3, 8, 8)
    ctx = context_for(model, (x,), options=Options(passes={"gradients", "modes"}))
    recorder = modes.EvalRecorder(ctx.inputs)
    with torch.no_grad(), preserved(model):
        model.eval()
        with recorder.watching(model):
            recorder.finish(ctx.inputs.call(model))
    ctx.results.modes_eval = recorder
    gradients.run(ctx)
    assert ctx.results.modes_train is not None and ctx.results.modes_train.run.compared
    with torch.no_grad():
        model.body[1].running_mean += 1.0  # modes' own eval() run differs from the recorded
    ctx.results.modes_eval = None
    modes.run(ctx)
    alone = context_for(model, (x,), options=Options(passes={"modes"}))
    modes.run(alone)
    assert ctx.report.modes.computed
    assert ctx.report.modes.model_dump() == alone.report.modes.model_dump()
    assert [n.mode_divergence for n in ctx.report.nodes] == [
        n.mode_divergence for n in alone.report.nodes
    ]
