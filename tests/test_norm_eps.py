"""fp16-underflow's norm part: norm layers whose eps the low-precision run rounds to zero.

float16's smallest subnormal is 2**-24 = 5.96e-8; round-to-nearest-even sends anything up
to half of it, 2**-25 = 2.98e-8, to 0. So eps=1e-12 (BERT's) or 1e-8 is lost, 3e-8 and
1e-5 are not. Whether the layer adds eps in float16 is the op's business: the tests pin
what torch 2.13 does on CPU under autocast (the check itself runs each layer to find out).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inspector.context import Options
from inspector.health.adhoc import context_for
from inspector.health.normeps import compute_dtype, rounds_to_zero
from inspector.passes import findings, numerics
from inspector.report import Finding


class PyLayerNorm(nn.Module):
    """A hand-written LayerNorm: var + eps in whatever dtype its input has."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return self.weight * (x - mean) / torch.sqrt(var + self.eps)


class UpcastRMSNorm(nn.Module):
    """HF's LlamaRMSNorm: the variance in float32 whatever the input's dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class Normed(nn.Module):
    """Linear (float16 under fp16 autocast) -> norm -> Linear."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.lin, self.norm, self.head = nn.Linear(4, 8), norm, nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.lin(x)))


class ConvInstance(nn.Module):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv1d(3, 8, 3), nn.InstanceNorm1d(8, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


def _found(model: nn.Module, x: torch.Tensor, dtype: str = "fp16") -> list[Finding]:
    ctx = context_for(model, (x,), options=Options(dtype=dtype))
    numerics.run(ctx)
    findings.run(ctx)
    return [
        f for f in ctx.report.findings if f.rule == "fp16-underflow" and "norm layer" in f.message
    ]


def x4() -> torch.Tensor:
    return torch.randn(16, 4)


def test_the_criterion_is_eps_rounding_to_zero() -> None:
    half_subnormal = 2.0**-25  # 2.98e-8: a tie, rounded to the even neighbour 0
    assert rounds_to_zero(1e-12, torch.float16) and rounds_to_zero(half_subnormal, torch.float16)
    assert not rounds_to_zero(3e-8, torch.float16)  # rounds up to 2**-24
    assert not rounds_to_zero(1e-5, torch.float16)  # subnormal, kept to 0.6%
    assert not rounds_to_zero(1e-12, torch.bfloat16)  # float32's exponent range
    assert not rounds_to_zero(0.0, torch.float16)  # no eps to lose


def test_a_python_layernorm_with_berts_eps_under_fp16() -> None:
    [found] = _found(Normed(PyLayerNorm(8, 1e-12)), x4())
    assert (found.severity, found.where) == ("warning", "norm")
    assert "1 norm layer(s) lose their eps in float16" in found.message
    assert "'norm' (PyLayerNorm, eps=1e-12, float16 input)" in found.message
    assert "below 3e-08 (half its smallest subnormal)" in found.message
    assert "eps >= 1e-5" in found.fix and "float32" in found.fix


@pytest.mark.parametrize("eps,lost", [(1e-8, True), (2.0**-25, True), (3e-8, False), (1e-5, False)])
def test_the_boundary_on_a_real_layer(eps: float, lost: bool) -> None:
    assert bool(_found(Normed(PyLayerNorm(8, eps)), x4())) is lost


def test_instance_norm_on_cpu_adds_eps_in_float16() -> None:
    # torch 2.13 CPU: instance_norm under fp16 autocast computes its statistics in float16
    [found] = _found(ConvInstance(1e-12), torch.randn(2, 3, 10))
    assert "'norm' (InstanceNorm1d, eps=1e-12, float16 input)" in found.message


def test_layers_that_keep_eps_in_float32_are_quiet() -> None:
    for norm in (
        nn.LayerNorm(8, eps=1e-12),  # BERT: autocast's layer_norm adds eps in float32
        nn.RMSNorm(8, eps=1e-12),
        nn.GroupNorm(2, 8, eps=1e-12),
        UpcastRMSNorm(8, 1e-12),  # HF's upcast
        PyLayerNorm(8, 1e-5),  # float16 holds 1e-5
    ):
        assert _found(Normed(norm), x4()) == [], type(norm).__name__


def test_a_norm_on_the_float32_input_is_quiet() -> None:
    # The model's input stays float32 under autocast: the Python norm adds eps in float32.
    model = nn.Sequential(PyLayerNorm(4, 1e-12), nn.Linear(4, 2))
    assert _found(model, x4()) == []


def test_float32_and_bf16_runs_are_quiet() -> None:
    model = Normed(PyLayerNorm(8, 1e-12))
    assert _found(model, x4(), dtype="float32") == []
    assert _found(model, x4(), dtype="bf16") == []  # 1e-12 is a normal bfloat16


def test_a_float16_model_computes_in_float16_without_autocast() -> None:
    model = Normed(PyLayerNorm(8, 1e-12)).half()
    ctx = context_for(model, (x4().half(),))
    assert compute_dtype(ctx) == torch.float16
    [found] = _found(model, x4().half(), dtype="float32")
    assert "'norm' (PyLayerNorm, eps=1e-12, float16 input)" in found.message


def test_the_check_leaves_the_model_as_it_was() -> None:
    model = Normed(nn.Sequential(nn.BatchNorm1d(8, eps=1e-12))).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _found(model, x4())
    assert not model.training and not model.norm[0].training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
