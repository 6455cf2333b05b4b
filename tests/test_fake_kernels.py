"""Fake kernels stricter than the real one: `_grouped_mm` (Mixtral's experts) takes
float32 on the CPU, its fake kernel only bfloat16. The fake run takes what the real CPU
kernel takes; where the refusal stands, the message names the op and the dtype."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from inspector.analyze import inspect_model
from inspector.context import Inputs, Options
from inspector.errors import FakeModeLimit
from inspector.fakevalues import new_fake_mode
from inspector.fit import check_inputs_fit

MODELS = Path(__file__).parent / "hf_tiny_models.py"


def _grouped(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # 8 tokens in 2 groups (rows 0-2, 3-7), 16 features in, 8 out; rows of 16 bytes or more
    return (
        torch.randn(8, 16, dtype=dtype),
        torch.randn(2, 16, 8, dtype=dtype),
        torch.tensor([3, 8], dtype=torch.int32),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_grouped_mm_on_fake_cpu_tensors_is_what_the_cpu_kernel_gives(dtype: torch.dtype):
    a, b, offs = _grouped(dtype)
    real = torch._grouped_mm(a, b, offs=offs)
    with new_fake_mode() as mode:
        fake = torch._grouped_mm(mode.from_tensor(a), mode.from_tensor(b), offs=offs)
    assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), dtype)
    assert fake.shape == (8, 8)  # [tokens, out features]


class _Float64Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(2, 16, 8, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offs = torch.tensor([3, 8], dtype=torch.int32, device=x.device)
        return torch._grouped_mm(x, self.weight, offs=offs)


def test_a_refused_dtype_is_named_and_the_inputs_are_not_blamed():
    mode = new_fake_mode()
    with mode:
        model = _Float64Experts()
        inputs = Inputs((torch.randn(8, 16, dtype=torch.float64),))
        with pytest.raises(FakeModeLimit) as caught:
            check_inputs_fit(model, inputs, [])
    text = str(caught.value)
    assert "aten._grouped_mm.default refuses float64" in text
    assert "the fake run takes bfloat16" in text  # the same shapes pass in bfloat16
    assert "_Float64Experts (root)" in text
    assert "Check --input" not in text and "do not fit" not in text


@pytest.mark.slow
def test_mixtral_under_fake_matches_the_measured_cpu_step():
    from hf_tiny_models import token_spec

    options = dict(passes={"memory"}, export="none")
    fake = inspect_model(f"{MODELS}:mixtral", token_spec(), Options(fake=True, **options))
    real = inspect_model(f"{MODELS}:mixtral", token_spec(), Options(**options))
    assert fake.memory.saved_activation_bytes == real.memory.saved_activation_bytes
    assert fake.memory.train_peak_bytes == real.memory.train_peak_bytes
    assert abs(real.memory.measured.saved_activation_error) < 0.01
    assert abs(real.memory.measured.train_peak_error) < 0.02
    assert not any("fake tensors" in w for w in real.meta.warnings)  # no real-copy fallback
