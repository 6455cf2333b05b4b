"""The built-in presets as data: names, published parameter counts, HF configs, inputs.

No torch here: the web process lists presets and checks names without importing it.
`inspector.loaders.presets.load_preset` builds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["PRESETS", "Preset", "preset_names"]


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    published_params: int  # the figure the model's authors give, for checking
    config: dict[str, Any] = field(default_factory=dict)  # a HF config; empty for own models
    spec: dict[str, Any] | None = None  # default input; None: from the config
    # --parallel plans its report gets when none are asked: the GPUs-needed table of
    # the models nobody trains on one GPU
    parallel: tuple[str, ...] = ()


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

# FSDP alone and FSDP across TP groups of 8 (one node), every layer checkpointed, as
# torchtitan trains Llama 3 70B: without checkpointing no world size fits 80 GiB
_LARGE_PLANS = ("fsdp:8,checkpoint=true", "fsdp:8,checkpoint=true+tp:8")

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
        Preset(
            "llama-3-70b",
            "Llama 3 70B",
            70_553_706_496,
            _llama(8192, 28672, 80, 64, 8),
            parallel=_LARGE_PLANS,
        ),
        Preset("mistral-7b", "Mistral 7B v0.1", 7_241_732_096, _MISTRAL),
        Preset(
            "mixtral-8x7b",
            "Mixtral 8x7B, sparse mixture of experts",
            46_702_792_704,
            {**_MISTRAL, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}
            | {"num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None},
            parallel=_LARGE_PLANS,
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
