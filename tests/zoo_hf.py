"""Hugging Face families of the zoo, from tiny configs written here (no download)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

VOCAB = 128
_TEXT = {"vocab_size": VOCAB, "max_position_embeddings": 64}
_BERTISH = {
    **_TEXT,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
}
_DECODER = {**_BERTISH, "use_cache": False}
_GQA = {**_DECODER, "num_key_value_heads": 2}
_SPECIAL_IDS = {
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 1,
}
_SEQ2SEQ = {
    "vocab_size": VOCAB,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "use_cache": False,
}

# name -> (config model_type, auto class, config kwargs, inputs kind)
_FAMILIES: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "bert": ("bert", "AutoModel", _BERTISH, "text"),
    "roberta": ("roberta", "AutoModel", {**_BERTISH, "max_position_embeddings": 66}, "text"),
    "distilbert": (
        "distilbert",
        "AutoModel",
        {**_TEXT, "dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64},
        "text",
    ),
    "albert": ("albert", "AutoModel", {**_BERTISH, "embedding_size": 16}, "text"),
    "deberta-v2": (
        "deberta-v2",
        "AutoModel",
        {**_BERTISH, "relative_attention": True, "pos_att_type": ["p2c", "c2p"]},
        "text",
    ),
    "electra": ("electra", "AutoModel", {**_BERTISH, "embedding_size": 16}, "text"),
    "gpt2": (
        "gpt2",
        "AutoModelForCausalLM",
        {"vocab_size": VOCAB, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64},
        "text",
    ),
    "gpt-neox": ("gpt_neox", "AutoModelForCausalLM", _DECODER, "text"),
    "opt": (
        "opt",
        "AutoModelForCausalLM",
        {**_DECODER, "ffn_dim": 64, "word_embed_proj_dim": 32},
        "text",
    ),
    "bloom": (
        "bloom",
        "AutoModelForCausalLM",
        {"vocab_size": VOCAB, "hidden_size": 32, "n_layer": 2, "n_head": 4, "use_cache": False},
        "text",
    ),
    "falcon": ("falcon", "AutoModelForCausalLM", _DECODER, "text"),
    "llama": ("llama", "AutoModelForCausalLM", _GQA, "text"),
    "mistral": ("mistral", "AutoModelForCausalLM", _GQA, "text"),
    "qwen2": ("qwen2", "AutoModelForCausalLM", _GQA, "text"),
    "gemma": ("gemma", "AutoModelForCausalLM", {**_GQA, "head_dim": 8}, "text"),
    "phi": ("phi", "AutoModelForCausalLM", _DECODER, "text"),
    "mixtral": (
        "mixtral",
        "AutoModelForCausalLM",
        {**_GQA, "num_local_experts": 4, "num_experts_per_tok": 2},
        "text",
    ),
    "mamba": (
        "mamba",
        "AutoModelForCausalLM",
        {"vocab_size": VOCAB, "hidden_size": 32, "state_size": 8, "num_hidden_layers": 2},
        "text",
    ),
    "t5": (
        "t5",
        "AutoModelForSeq2SeqLM",
        {
            "vocab_size": VOCAB,
            "d_model": 32,
            "d_ff": 64,
            "d_kv": 8,
            "num_layers": 2,
            "num_heads": 4,
            "use_cache": False,
        },
        "seq2seq",
    ),
    "bart": (
        "bart",
        "AutoModelForSeq2SeqLM",
        {**_SEQ2SEQ, "max_position_embeddings": 64},
        "seq2seq",
    ),
    "hf-vit": (
        "vit",
        "AutoModel",
        {**_BERTISH, "image_size": 32, "patch_size": 8},
        "image32",
    ),
    "hf-swin": (
        "swin",
        "AutoModel",
        {
            "image_size": 32,
            "patch_size": 4,
            "embed_dim": 16,
            "depths": [1, 1],
            "num_heads": [2, 2],
            "window_size": 4,
        },
        "image32",
    ),
    "hf-convnext": (
        "convnext",
        "AutoModel",
        {"hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2, "image_size": 32},
        "image32",
    ),
    "clip": (
        "clip",
        "AutoModel",
        {
            "text_config": {**_BERTISH, "max_position_embeddings": 16},
            "vision_config": {**_BERTISH, "image_size": 32, "patch_size": 8},
            "projection_dim": 16,
        },
        "clip",
    ),
    "whisper": (
        "whisper",
        "AutoModel",
        {
            **_SEQ2SEQ,
            "num_mel_bins": 16,
            "max_source_positions": 16,
            "max_target_positions": 32,
            **_SPECIAL_IDS,
        },
        "audio-seq2seq",
    ),
    "wav2vec2": (
        "wav2vec2",
        "AutoModel",
        {
            **_BERTISH,
            "conv_dim": (16, 16),
            "conv_stride": (5, 4),
            "conv_kernel": (10, 4),
            "num_conv_pos_embeddings": 16,
            "num_conv_pos_embedding_groups": 4,
            "mask_time_prob": 0.0,  # SpecAugment draws masks with numpy: not repeatable
        },
        "audio",
    ),
}


def _ids(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq))


_INPUTS: dict[str, Callable[[], dict[str, torch.Tensor]]] = {
    "text": lambda: {"input_ids": _ids(2, 16)},
    "seq2seq": lambda: {"input_ids": _ids(2, 16), "decoder_input_ids": _ids(2, 8)},
    "image32": lambda: {"pixel_values": torch.randn(2, 3, 32, 32)},
    "clip": lambda: {"input_ids": _ids(2, 8), "pixel_values": torch.randn(2, 3, 32, 32)},
    "audio-seq2seq": lambda: {
        "input_features": torch.randn(2, 16, 32),
        "decoder_input_ids": _ids(2, 8),
    },
    "audio": lambda: {"input_values": torch.randn(2, 800)},
}


def _builder(model_type: str, auto: str, config: dict[str, Any]) -> Callable[[], Any]:
    def build() -> torch.nn.Module:
        import transformers

        cfg = transformers.AutoConfig.for_model(model_type, **config)
        return getattr(transformers, auto).from_config(cfg)

    return build


# a step that varies with its random draws: wav2vec2's layerdrop (0.1) skips layers
_DRAWS = {"wav2vec2": 4}

HF_MODELS: list[dict[str, Any]] = [
    {
        "name": name if name.startswith("hf-") else f"hf-{name}",
        "kind": "hf",
        "build": _builder(model_type, auto, config),
        "inputs": (lambda kind=kind: ((), _INPUTS[kind]())),
        "draws": _DRAWS.get(name, 1),
    }
    for name, (model_type, auto, config, kind) in _FAMILIES.items()
]
