"""Presets and Hugging Face config uploads: built on fake tensors, no weights, no download."""

from __future__ import annotations

import json
import resource

import pytest
import torch

from inspector.errors import LoadError
from inspector.loaders.fakebuild import skip_init
from inspector.loaders.hfconfig import load_config
from inspector.loaders.presets import PRESETS, load_preset


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields tied ones once


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_builds_fake_with_the_published_parameter_count(name: str) -> None:
    loaded = load_preset(name, fake_mode=_fake_mode())
    params = list(loaded.model.parameters())
    assert all(type(p).__name__ in ("FakeTensor", "Parameter") for p in params)
    assert all(p.untyped_storage().nbytes() == 0 or _is_fake(p) for p in params)
    # Within 0.1% of the published figure; these configs match it exactly.
    assert _count(loaded.model) == PRESETS[name].published_params
    assert loaded.inputs is not None and loaded.source_kind == "preset"


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def test_llama_70b_is_70_55_billion_and_costs_no_memory() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    loaded = load_preset("llama-3-70b", fake_mode=_fake_mode())
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    # 70,553,706,496 params: 8192*128256 (embed) + 80 layers + norm + 8192*128256 (lm head)
    assert _count(loaded.model) == 70_553_706_496
    assert abs(_count(loaded.model) / 70.6e9 - 1) < 0.001
    assert grown_kib < 512 * 1024  # far below the 141 GB its bf16 weights would take


def test_unknown_preset_lists_the_presets() -> None:
    with pytest.raises(LoadError, match="llama-3-70b"):
        load_preset("llama-9000")


def test_config_json_builds_the_named_architecture(tmp_path) -> None:
    config = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_layer": 2,
        "n_embd": 64,
        "n_head": 4,
        "vocab_size": 1000,
        "n_positions": 128,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    loaded = load_config(str(path), fake_mode=_fake_mode())
    assert type(loaded.model).__name__ == "GPT2LMHeadModel"
    # tied head: wte 1000*64 + wpe 128*64 + 2 blocks * (12*64*64 + 13*64) + ln_f 2*64
    assert _count(loaded.model) == 1000 * 64 + 128 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64
    assert len(loaded.sha256) == 64
    inputs = loaded.inputs.build()
    assert inputs.dims == {"B": 1, "S": 128}


def test_mixtral_config_without_architectures_gets_the_causal_lm(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "mixtral",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_local_experts": 4,
                "vocab_size": 500,
            }
        )
    )
    loaded = load_config(str(path), fake_mode=_fake_mode())
    assert type(loaded.model).__name__ == "MixtralForCausalLM"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"hidden_size": 8}', "no 'model_type'"),
        ('{"model_type": "no-such-family"}', "not known to transformers"),
    ],
)
def test_bad_config_files_say_what_is_wrong(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(LoadError, match=message):
        load_config(str(path), fake_mode=_fake_mode())


def test_skip_init_restores_the_initialisers() -> None:
    original = torch.nn.init.trunc_normal_
    with skip_init():
        t = torch.zeros(3)
        assert torch.nn.init.normal_(t) is t and t.abs().sum() == 0
    assert torch.nn.init.trunc_normal_ is original
