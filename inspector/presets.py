"""Built-in presets: well-known architectures by name, each with a default input.

`inspector inspect preset:llama-3-70b --input '{"dims": {"B": 1, "S": 4096}}'`
Transformer presets are Hugging Face configs written out here (no download); ResNet-50 is
the project's own. Every preset is analysed on fake tensors: no weights are allocated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from inspector.context import LoadedModel
from inspector.errors import LoadError
from inspector.fakebuild import building_under

__all__ = ["PRESETS", "Preset", "load_preset", "preset_names"]


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    published_params: int  # the figure the model's authors give, for checking
    config: dict[str, Any] = field(default_factory=dict)  # a HF config; empty for own models
    spec: dict[str, Any] | None = None  # default input; None: from the config


def _llama(hidden: int, inter: int, layers: int, heads: int, kv: int) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


_MISTRAL = {
    "model_type": "mistral",
    "architectures": ["MistralForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "dtype": "bfloat16",
}

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "gpt2",
            "GPT-2 small (124M)",
            124_439_808,
            {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]},
        ),
        Preset(
            "gpt2-xl",
            "GPT-2 XL (1.5B)",
            1_557_611_200,
            {
                "model_type": "gpt2",
                "architectures": ["GPT2LMHeadModel"],
                "n_embd": 1600,
                "n_layer": 48,
                "n_head": 25,
            },
        ),
        Preset(
            "bert-base",
            "BERT-base, uncased vocabulary (110M)",
            109_482_240,
            {"model_type": "bert", "architectures": ["BertModel"]},
            {
                "input_ids": {"shape": ["B", "S"], "dtype": "int64", "high": 30522},
                "dims": {"B": 8, "S": 512},
            },
        ),
        Preset("llama-3-8b", "Llama 3 8B", 8_030_261_248, _llama(4096, 14336, 32, 32, 8)),
        Preset("llama-3-70b", "Llama 3 70B", 70_553_706_496, _llama(8192, 28672, 80, 64, 8)),
        Preset("mistral-7b", "Mistral 7B v0.1", 7_241_732_096, _MISTRAL),
        Preset(
            "mixtral-8x7b",
            "Mixtral 8x7B, sparse mixture of experts",
            46_702_792_704,
            {**_MISTRAL, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}
            | {"num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None},
        ),
        Preset(
            "vit-b-16",
            "ViT-B/16 at 224x224, 1000 classes",
            86_567_656,
            {
                "model_type": "vit",
                "architectures": ["ViTForImageClassification"],
                "num_labels": 1000,
            },
        ),
        Preset(
            "resnet-50",
            "ResNet-50 (the project's own, torchvision's layout)",
            25_557_032,
            spec={"x": {"shape": ["B", 3, 224, 224]}, "dims": {"B": 32}},
        ),
    ]
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def load_preset(name: str, *, fake_mode: Any = None, device: str = "cpu") -> LoadedModel:
    """Build preset `name` (inside `fake_mode` when given) with its default input."""
    preset = PRESETS.get(name)
    if preset is None:
        raise LoadError(f"unknown preset {name!r}. Presets: {', '.join(preset_names())}.")
    if preset.config:
        from inspector.hfconfig import build_from_config

        loaded = build_from_config(
            preset.config, name=f"preset:{name}", fake_mode=fake_mode, device=device
        )
    else:
        loaded = _own_model(preset, fake_mode, device)
    loaded.source_kind = "preset"
    loaded.entrypoint = name
    if preset.spec is not None:
        from inspector.inputspec import parse_input

        loaded.inputs = parse_input(json.dumps(preset.spec), loaded)
    return loaded


def _own_model(preset: Preset, fake_mode: Any, device: str) -> LoadedModel:
    from inspector.zoo.resnet import ResNet50

    with building_under(fake_mode, device):
        model = ResNet50()
    return LoadedModel(model=model, source_kind="preset", source_name=f"preset:{preset.name}")
