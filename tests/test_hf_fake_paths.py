"""Under fake tensors transformers takes the path a real run takes.

transformers skips the causal mask when the padding mask is all ones, but only when it
can read the mask: a plain fake tensor counts as "tracing" (`is_tracing` ->
`is_fake_tensor`), so the fake run used to build an explicit [B, 1, S, S] mask, and SDPA
given a mask made `repeat_kv` expand the grouped K/V heads: +7.2% saved activations on
the tiny Llama below. The inspector's fake mode keeps the values of small integer
tensors (inspector.fakevalues), so the estimate on fake tensors equals the real step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inspector.analyze import inspect_model
from inspector.context import Options
from inspector.fakevalues import new_fake_mode, value_of

MODELS = Path(__file__).parent / "hf_tiny_models.py"


def _memory(entry: str, spec: str, fake: bool):  # noqa: ANN202 - the report's Memory
    options = Options(fake=fake, passes={"memory"}, export="none")
    return inspect_model(f"{MODELS}:{entry}", spec, options).memory


@pytest.mark.parametrize(
    ("entry", "padded"), [("llama", False), ("llama", True), ("gpt_neox", False)]
)
def test_fake_estimate_equals_the_real_one_and_the_measured_step(entry: str, padded: bool):
    from hf_tiny_models import token_spec

    spec = token_spec(padded=padded)
    real, fake = _memory(entry, spec, fake=False), _memory(entry, spec, fake=True)
    measured = real.measured
    assert fake.saved_activation_bytes == real.saved_activation_bytes
    assert fake.train_peak_bytes == real.train_peak_bytes
    assert fake.forward_peak_bytes == real.forward_peak_bytes
    assert abs(measured.saved_activation_error) < 0.01, measured
    assert abs(measured.train_peak_error) < 0.02, measured


def test_transformers_skips_the_causal_mask_of_an_unpadded_fake_batch():
    from transformers.masking_utils import _ignore_causal_mask_sdpa

    with new_fake_mode():
        ones = torch.ones(2, 8, dtype=torch.bool)
        padded = torch.ones(2, 8, dtype=torch.bool)
        padded[0, :3] = False  # left padding in the first row
        unknown = torch.empty(2, 8, dtype=torch.bool)  # no value: still "tracing"
        assert value_of(ones) is not None and value_of(unknown) is None
        # the arguments are (padding_mask, q_length, kv_length, q_offset, kv_offset)
        assert _ignore_causal_mask_sdpa(ones, 8, 8, 0, 0) is True
        assert bool(_ignore_causal_mask_sdpa(padded, 8, 8, 0, 0)) is False
        assert _ignore_causal_mask_sdpa(unknown, 8, 8, 0, 0) is False


def test_a_value_is_dropped_when_an_op_writes_what_it_cannot_compute():
    with new_fake_mode():
        mask = torch.ones(4, dtype=torch.long)
        view = mask[:2]
        weights = torch.randn(4)  # random floats: no value
        assert view.tolist() == [1, 1]
        mask.copy_(weights.long())  # the new contents are unknown ...
        assert value_of(mask) is None
        assert value_of(view) is None  # ... in every view of the same storage
