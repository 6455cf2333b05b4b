"""Memory analysis: numbers by hand, estimate vs measured, fake vs real."""

from __future__ import annotations

import pytest
import torch
from models import MLP, ResNet18, make_gpt2, make_mlp, make_small_cnn
from torch import nn

from inspector.context import (
    CaptureResult,
    Context,
    InputFactory,
    Inputs,
    LoadedModel,
    Options,
)
from inspector.loaders.fakebuild import building_under
from inspector.memory.measure import measure
from inspector.memory.optimizer import make_optimizer, optimizer_state_bytes, state_bytes_of
from inspector.memory.scaling import (
    MAX_BATCH,
    Line,
    fit_line,
    max_batch,
    phase_lines,
    steepest,
    window_lines,
)
from inspector.memory.shadow import fake_inputs, fake_shadow, new_fake_mode
from inspector.memory.step import StepOptions, forward_run, train_step, warm_up
from inspector.memory.timeline import downsample
from inspector.memory.tracker import Point
from inspector.passes import measure as measure_pass
from inspector.passes import memory as memory_pass
from inspector.report import Node, Report

LINEAR_PARAM_BYTES = (1024 * 1024 + 1024) * 4  # weight + bias, float32 = 4,198,400


def fake_step(model: nn.Module, args: tuple, optimizer: str = "adam", **kw):
    mode = new_fake_mode()
    opts = StepOptions(optimizer=optimizer, fake_mode=mode, **kw)
    shadow, inputs = fake_shadow(model, mode), fake_inputs(Inputs(args), mode)
    return train_step(shadow, inputs, opts), forward_run(shadow, inputs, opts)


class MLPFactory(InputFactory):
    def build(self, dims: dict[str, int] | None = None, device: str = "cpu") -> Inputs:
        b = (dims or {}).get("B", self.dims["B"])
        return Inputs((torch.randn(b, 784),), {}, {"B": b})

    @property
    def batch_dim(self) -> str:
        return "B"


def mlp_context(batch: int = 32, fake: bool = False, **options) -> Context:
    mode = new_fake_mode() if fake else None
    with building_under(mode):
        model, (args, _) = make_mlp(batch)
    capture = CaptureResult("fx", [], torch.fx.symbolic_trace(model))
    nodes = [
        Node(id=i, name=n.name, op=n.op, target=str(n.target))
        for i, n in enumerate(capture.graph_module.graph.nodes)
    ]
    return Context(
        LoadedModel(model, "python", "mlp", fake_mode=mode),
        MLPFactory({"B": batch}),
        Inputs(args, {}, {"B": batch}),
        Options(fake=fake, **options),
        Report(nodes=nodes),
        capture=capture,
        fake_mode=mode,
    )


def test_linear_by_hand():
    result, _ = fake_step(nn.Linear(1024, 1024), (torch.randn(64, 1024),))
    assert result.saved_bytes == 64 * 1024 * 4  # its input, 262,144 B; the weight is a param
    assert result.param_bytes == LINEAR_PARAM_BYTES
    assert result.grad_bytes == LINEAR_PARAM_BYTES
    # Adam: exp_avg + exp_avg_sq (2x params) + one float32 step scalar per tensor (2 tensors)
    assert result.optimizer_bytes == 2 * LINEAR_PARAM_BYTES + 2 * 4


def test_optimizer_state_by_hand_matches_real_optimizer():
    model = nn.Linear(1024, 1024)
    params = list(model.parameters())
    expected = {"sgd": 0, "momentum": LINEAR_PARAM_BYTES, "adam": 2 * LINEAR_PARAM_BYTES + 8}
    for name, nbytes in expected.items():
        assert sum(optimizer_state_bytes(params, name).values()) == nbytes
        optimizer = make_optimizer(name, params)
        warm_up(optimizer, params)
        assert state_bytes_of(optimizer) == nbytes, name


def test_relu_chain_by_hand():
    # Linear(1000, 1000, no bias) then three ReLUs, batch 8: each tensor 8*1000*4 = 32,000 B.
    model = nn.Sequential(nn.Linear(1000, 1000, bias=False), nn.ReLU(), nn.ReLU(), nn.ReLU())
    train, forward = fake_step(model, (torch.randn(8, 1000),), optimizer="sgd")
    # Linear saves its input; each ReLU saves its own output: 4 * 32,000
    assert train.saved_bytes == 4 * 32_000
    assert train.saved_by_label == {"(input)": 32_000, "1": 32_000, "2": 32_000, "3": 32_000}
    # no_grad: weight 4,000,000 + input + two activations alive at once (a ReLU's in and out)
    assert forward.peak_bytes == 4_000_000 + 3 * 32_000


def test_resnet18_stage_outputs_fake():
    mode = new_fake_mode()
    with building_under(mode):
        model, x = ResNet18(), torch.randn(32, 3, 224, 224)
    result, _ = fake_step(model, (x,), optimizer="sgd")
    out = result.module_output_bytes
    assert out["conv1"] == 32 * 64 * 112 * 112 * 4 == 102_760_448
    assert out["maxpool"] == 32 * 64 * 56 * 56 * 4 == 25_690_112
    assert out["layer1"] == 32 * 64 * 56 * 56 * 4
    assert out["layer2"] == 32 * 128 * 28 * 28 * 4 == 12_845_056
    assert out["layer3"] == 32 * 256 * 14 * 14 * 4 == 6_422_528
    assert out["layer4"] == 32 * 512 * 7 * 7 * 4 == 3_211_264
    assert out["fc"] == 32 * 1000 * 4 == 128_000
    # bn1 saves conv1's output, which conv1 produced
    assert result.saved_by_label["conv1"] == 102_760_448


def test_fit_and_max_batch_by_hand():
    line = fit_line([(8, 1000 + 8 * 50), (16, 1000 + 16 * 50)])
    assert (line.fixed, line.per_sample) == (1000, 50)
    grows, step = Line(1000, 50), Line(3000, 0)
    assert max_batch([grows, step], 5000) == (5000 - 1000) // 50 == 80
    assert max_batch([grows, step], 2500) == 0  # the optimizer step alone needs 3000
    assert max_batch([Line(100, 0)], 5000) == MAX_BATCH


def test_each_stretch_of_the_step_gets_its_own_line():
    # at B=2 and 4 the peak is the end of the backward (3000, then 3002) and one line
    # through those peaks would grow by 1 B a sample; the forward's stretch grows by 50
    runs = [(2, [1100, 3000]), (4, [1200, 3002])]
    lines = window_lines(runs)
    assert lines == [Line(1000, 50), Line(2998, 1)]
    assert steepest(lines) == Line(1000, 50)
    assert max_batch(lines, 10_000) == (10_000 - 1000) // 50 == 180
    assert max_batch([fit_line([(2, 3000), (4, 3002)])], 10_000) == 7002  # the old fit
    assert window_lines([(2, [1, 2]), (4, [1, 2, 3])]) is None  # another op sequence
    by_phase = phase_lines(
        [(2, {"forward": 1100, "backward": 3000}), (4, {"forward": 1200, "backward": 3002})]
    )
    assert by_phase == [Line(2998, 1), Line(1000, 50)]  # backward, forward


def test_largest_batch_is_the_one_a_fake_step_finds_fitting():
    """The predicted largest batch for a budget, checked by fake training steps at that
    batch and one more (ground truth: the tracker's peak at those batches)."""
    budget = 64 * 2**20
    ctx = mlp_context(2, fake=True, budgets_bytes=[budget])
    memory_pass.run(ctx)
    best = ctx.report.memory.max_batch[str(budget)]
    assert 1000 < best < MAX_BATCH
    peaks = []
    for b in (best, best + 1):
        model, (args, _) = make_mlp(b)
        train, _ = fake_step(model, args, optimizer="adamw")
        peaks.append(max(train.phase_peaks.values()))
    assert peaks[0] <= budget < peaks[1]


def test_pass_on_mlp_real_matches_measured_and_hand_numbers():
    ctx = mlp_context(32)
    memory_pass.run(ctx)
    measure_pass.run(ctx)  # the estimate's real step, a pass of its own
    mem = ctx.report.memory
    # MLP 784-512-256-10 saves its input and both ReLU outputs: b * (784 + 512 + 256) * 4
    assert mem.saved_activation_bytes == 32 * 6208 == 198_656
    assert [p.saved_activation_bytes for p in mem.batch_scaling] == [32 * 6208, 64 * 6208]
    params = (784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10) * 4  # 2,143,272
    assert mem.param_bytes == mem.grad_bytes == params
    assert mem.measured is not None
    assert mem.measured.saved_activation_bytes == 198_656
    assert abs(mem.measured.train_peak_error) < 1e-3
    assert abs(mem.forward_peak_bytes - mem.measured.forward_peak_bytes) <= 0.001 * params
    # per node (fx graph): the saved bytes add up to the total
    assert sum(n.saved_bytes or 0 for n in ctx.report.nodes) == mem.saved_activation_bytes
    assert ctx.report.nodes[0].saved_bytes == 32 * 784 * 4  # x, saved by the first Linear
    assert {p.phase for p in mem.timeline} == {"forward", "backward", "optimizer"}
    assert max(p.live_bytes for p in mem.timeline) == mem.train_peak_bytes


def test_fake_model_gives_the_real_estimate():
    real, fake = mlp_context(16, measure=False), mlp_context(16, fake=True)
    memory_pass.run(real)
    memory_pass.run(fake)
    a, b = real.report.memory, fake.report.memory
    assert a.measured is None and b.measured is None
    for key in (
        "saved_activation_bytes",
        "train_peak_bytes",
        "forward_peak_bytes",
        "optimizer_bytes",
        "fixed_bytes",
        "per_sample_bytes",
        "max_batch",
    ):
        assert getattr(a, key) == getattr(b, key), key


@pytest.mark.parametrize("optimizer", ["none", "sgd", "momentum", "adamw"])
def test_small_cnn_estimate_vs_profiler(optimizer):
    model, (args, _) = make_small_cnn(8)  # BatchNorm and Dropout, in train mode
    train, forward = fake_step(model, args, optimizer=optimizer)
    m = measure(model, Inputs(args), StepOptions(optimizer=optimizer))
    assert train.saved_bytes == m.saved_activation_bytes
    assert abs(train.peak_bytes - m.train_peak_bytes) / m.train_peak_bytes < 0.01
    assert abs(forward.peak_bytes - m.forward_peak_bytes) / m.forward_peak_bytes < 0.01


def test_bf16_autocast_halves_float_activations():
    model = MLP()
    base, _ = fake_step(model, (torch.randn(64, 784),), optimizer="sgd")
    bf16, _ = fake_step(model, (torch.randn(64, 784),), optimizer="sgd", autocast=torch.bfloat16)
    # The first Linear saves the bf16 casts of the input and weight, not the fp32 input.
    assert bf16.saved_by_label["net.1"] == base.saved_by_label["net.1"] // 2


def test_timeline_downsampling_keeps_the_peak():
    points = [Point("forward", str(i), i % 97) for i in range(10_000)]
    points[4321] = Point("backward", "peak", 10**9)
    kept = downsample(points, limit=200)
    assert len(kept) <= 220
    assert max(p.live_bytes for p in kept) == 10**9


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA path: no CUDA device here")
def test_cuda_estimate_vs_max_memory_allocated():
    # GPT-2 small: attention, layer norms and a tied head through cuBLAS, no cuDNN
    # convolution workspaces (which the estimate leaves out: bench/RESULTS.md, CUDA)
    model, (_, kwargs) = make_gpt2(batch=4, seq=256)
    model, kwargs = model.train().cuda(), {k: v.cuda() for k, v in kwargs.items()}
    mode = new_fake_mode()
    opts = StepOptions(optimizer="adamw", device="cuda", round_to=512, fake_mode=mode)
    inputs = Inputs((), kwargs)
    train = train_step(fake_shadow(model, mode), fake_inputs(inputs, mode), opts)
    m = measure(model, inputs, StepOptions(optimizer="adamw", device="cuda", round_to=512))
    assert m.method == "cuda.max_memory_allocated"
    assert abs(train.peak_bytes - m.train_peak_bytes) / m.train_peak_bytes < 0.02
