"""The statistics and comparisons that go through a tensor slice by slice
(inspector/health/slices.py) give what their whole-tensor definitions give: each is
checked against that definition, computed in float64 or by torch's own function, on
tensors of several slices with the case that matters in a later slice."""

from __future__ import annotations

import math

import pytest
import torch

from inspector.health.backprop import grad_norm, grad_stats
from inspector.health.maxdiff import all_close, float32_max_abs_diff
from inspector.health.modecheck import channel_variance
from inspector.health.slices import SLICE
from inspector.health.stats import nonzero_and_norm

_GEN = torch.Generator().manual_seed(0)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_GEN)


def _exact_max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def test_max_abs_diff_is_float64s_bit_for_bit_across_slices() -> None:
    a = _randn(3 * SLICE + 5)
    b = a + 1e-3 * _randn(a.numel())
    assert float32_max_abs_diff(a, b) == _exact_max_diff(a, b)
    b[2 * SLICE + 7] += 5.0  # the largest difference, in the third slice
    assert float32_max_abs_diff(a, b) == _exact_max_diff(a, b) > 4.9
    # two elements whose float32 differences tie but whose exact ones do not
    c, d = torch.zeros(2 * SLICE), torch.zeros(2 * SLICE)
    c[3], d[3] = 1.0, 2.0**-25  # 1 - 2**-25 rounds to 1.0 in float32
    c[SLICE + 3] = 1.0
    assert float32_max_abs_diff(c, d) == 1.0 == _exact_max_diff(c, d)
    c[SLICE + 3], d[SLICE + 3] = 1.0, -(2.0**-30)  # exactly 1 + 2**-30: the larger
    assert float32_max_abs_diff(c, d) == 1.0 + 2.0**-30 == _exact_max_diff(c, d)


def test_max_abs_diff_leaves_nan_inf_and_flushed_zeros_to_the_float64_path() -> None:
    a = _randn(2 * SLICE)
    b = a.clone()
    assert float32_max_abs_diff(a, b) == 0.0
    b[SLICE + 1] = float("nan")
    assert float32_max_abs_diff(a, b) is None
    b[SLICE + 1] = float("inf")
    assert float32_max_abs_diff(a, b) is None
    tiny = torch.zeros(2 * SLICE)
    tiny[SLICE + 2] = 1e-45  # a subnormal: a difference that may flush to zero
    zeros = torch.zeros(2 * SLICE)
    got = float32_max_abs_diff(tiny, zeros)
    assert got is None or got == _exact_max_diff(tiny, zeros)


def test_max_abs_diff_of_strided_tensors() -> None:
    a = _randn(700, 600)
    b = a + 1e-4 * _randn(700, 600)
    assert float32_max_abs_diff(a.t(), b.t()) == _exact_max_diff(a, b)


@pytest.mark.parametrize("case", ["equal", "close", "far-last-slice", "nan", "inf", "inf-sign"])
def test_all_close_is_torch_allclose_with_equal_nan(case: str) -> None:
    a = _randn(3, SLICE + 11)
    b = a + 1e-7 * _randn(3, SLICE + 11)
    if case == "equal":
        b = a.clone()
    elif case == "far-last-slice":
        b[2, -1] += 1.0
    elif case == "nan":
        a[1, 5] = b[1, 5] = float("nan")
    elif case == "inf":
        a[2, 9] = b[2, 9] = float("inf")
    elif case == "inf-sign":
        a[2, 9], b[2, 9] = float("inf"), float("-inf")
    want = torch.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert all_close(a, b, rtol=1e-5, atol=1e-6) is want
    assert want is (case in ("equal", "close", "nan", "inf"))
    assert not all_close(a, b[:, :-1], rtol=1e-5, atol=1e-6)  # shapes differ


@pytest.mark.parametrize(
    "shape", [(8, 64, 56, 56), (4096, 16), (3, 5, 7), (2, 3), (16, 32, 9, 9, 9)]
)
def test_channel_variance_is_the_unbiased_variance_per_channel(shape: tuple[int, ...]) -> None:
    x = _randn(*shape) * 3 + 10  # an offset that a one-pass formula would lose digits to
    exact = x.double().transpose(0, 1).reshape(shape[1], -1).var(1)
    assert torch.allclose(channel_variance(x), exact, rtol=1e-6, atol=0)


def test_channel_variance_of_channels_last_and_bfloat16_inputs() -> None:
    x = _randn(8, 64, 28, 28)
    for y in (x.contiguous(memory_format=torch.channels_last), x.bfloat16()):
        exact = y.double().transpose(0, 1).reshape(64, -1).var(1)
        assert torch.allclose(channel_variance(y), exact, rtol=1e-6, atol=0)


def test_nonzero_and_norm_across_slices() -> None:
    x = _randn(2 * SLICE + 3)
    x[::3] = 0.0
    x[SLICE + 1] = float("nan")  # counted as nonzero, as count_nonzero does
    nonzero, norm = nonzero_and_norm(x)
    assert nonzero == int(torch.count_nonzero(x))
    assert math.isnan(norm)
    x[SLICE + 1] = 0.5
    nonzero, norm = nonzero_and_norm(x)
    assert nonzero == int(torch.count_nonzero(x))
    assert norm == pytest.approx(torch.linalg.vector_norm(x.double()).item(), rel=1e-12)
    assert grad_stats(x).zero_fraction == 1.0 - nonzero / x.numel()
    assert nonzero_and_norm(x, count=False) == (0, norm)
    assert nonzero_and_norm(torch.empty(0)) == (0, 0.0)


def test_value_statistics_in_one_pass_are_their_float64_definitions() -> None:
    """Mean and spread combined from the slices' own (Chan et al.), counts and range, on
    values offset far from zero, with zeros, tiny values and float16 overflows in later
    slices."""
    from inspector.health.stats import FP16_MAX, FP16_MIN_NORMAL, tensor_stats

    x = _randn(3 * SLICE + 17) * 3 + 1e4
    x[SLICE + 5 : SLICE + 500] = 0.0
    x[2 * SLICE + 1 : 2 * SLICE + 40] = 1e-6  # float16 subnormal
    x[3 * SLICE + 3] = 1e5  # float16 overflow
    wide = x.double()
    stats = tensor_stats(x)
    assert stats.mean == pytest.approx(wide.mean().item(), rel=1e-14)
    assert stats.std == pytest.approx(wide.std(correction=0).item(), rel=1e-12)
    assert (stats.min, stats.max) == (x.min().item(), x.max().item())
    assert stats.zero_fraction == pytest.approx(495 / x.numel(), rel=1e-12)
    assert stats.fp16_overflow_count == int((x.abs() > FP16_MAX).sum()) == 1
    tiny = int(((x.abs() < FP16_MIN_NORMAL) & (x != 0)).sum())
    assert stats.fp16_underflow_fraction == tiny / int((x != 0).sum())
    error = (x.bfloat16().double() - wide).pow(2).mean().sqrt().item()
    assert stats.bf16_error == pytest.approx(error / wide.std(correction=0).item(), rel=1e-12)
    assert stats.nan_count == stats.inf_count == 0


def test_a_node_gradients_norm_is_its_finite_values_float64_norm() -> None:
    g = _randn(2 * SLICE + 9)
    exact = torch.linalg.vector_norm(g.double()).item()
    assert grad_norm(g) == (pytest.approx(exact, rel=1e-12), False)
    g[SLICE + 4], g[7] = float("nan"), float("-inf")  # left out, and said
    finite = torch.linalg.vector_norm(torch.where(torch.isfinite(g), g, 0).double()).item()
    assert grad_norm(g) == (pytest.approx(finite, rel=1e-12), True)
    assert grad_norm(g)[0] == grad_stats(g).norm  # the parameters' rows' norm


@pytest.mark.parametrize("kind", ["", "relu", "sigmoid"])
def test_more_slices_make_no_more_allocations(kind: str) -> None:
    """Inside the gradients pass's recorded step every new tensor is an allocation event
    the profiler keeps and the step's reading goes through: a slice's reductions and
    comparisons write into what the statistics made once per tensor. On one thread, as
    the passes run (with more, a large reduction makes its threads' partial results)."""
    from inspector.health.stats import tensor_stats
    from inspector.memory.allocations import allocations_recorded, read_events

    def allocations(slices: int) -> int:
        x = _randn(8, slices * SLICE // 8).abs_() * 1e-3  # in (0, 1): sigmoid-like, tiny values
        x[:, ::5] = 0.0
        tensor_stats(x, kind)  # once first: nothing lazily made on a first call is counted
        with allocations_recorded() as roots:
            tensor_stats(x, kind)
            nonzero_and_norm(x)
            float32_max_abs_diff(x, x)  # no slice holds the largest difference
        return sum(1 for _, size, _ in read_events(roots()).events if size > 0)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert allocations(2) == allocations(6)
    finally:
        torch.set_num_threads(threads)
