"""Hugging Face models from tiny configs (random weights, nothing downloaded), as a user's
model file: `inspector inspect tests/hf_tiny_models.py:llama --input ...`. Used by the
tests of what transformers does under fake tensors and by `bench/hf_fake.py`."""

from __future__ import annotations

import json

import torch
import transformers as tf
from torch import nn

VOCAB = 256
_DECODER = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=VOCAB,
    max_position_embeddings=128,
)


def llama() -> nn.Module:  # grouped-query attention: 4 query heads share 2 K/V heads
    return tf.LlamaForCausalLM(tf.LlamaConfig(num_key_value_heads=2, **_DECODER))


def mistral() -> nn.Module:
    return tf.MistralForCausalLM(tf.MistralConfig(num_key_value_heads=2, **_DECODER))


def qwen2() -> nn.Module:
    return tf.Qwen2ForCausalLM(tf.Qwen2Config(num_key_value_heads=2, **_DECODER))


def gemma() -> nn.Module:
    return tf.GemmaForCausalLM(tf.GemmaConfig(num_key_value_heads=2, head_dim=16, **_DECODER))


def phi() -> nn.Module:
    return tf.PhiForCausalLM(tf.PhiConfig(**_DECODER))


def gpt_neox() -> nn.Module:
    return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**_DECODER))


def mixtral() -> nn.Module:  # 4 experts, 2 per token
    config = tf.MixtralConfig(
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **_DECODER
    )
    return tf.MixtralForCausalLM(config)


def bart() -> nn.Module:
    config = tf.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64,
    )  # fmt: skip
    return tf.BartForConditionalGeneration(config)


def swin() -> nn.Module:  # 32x32 images, windows of 4 patches, two stages
    config = tf.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
        window_size=4, num_labels=3,
    )  # fmt: skip
    return tf.SwinForImageClassification(config)


SWIN_SPEC = json.dumps({"pixel_values": {"shape": ["B", 3, 32, 32]}, "dims": {"B": 2}})
DECODERS = ["llama", "mistral", "qwen2", "gemma", "phi", "gpt_neox"]


def token_spec(batch: int = 2, seq: int = 32, padded: bool = False) -> str:
    """Token ids, their labels and an attention mask: all ones (no padding: transformers
    may skip the causal mask), or random 0/1 (padding: it must build one)."""
    ids = {"shape": ["B", "S"], "dtype": "int64", "high": VOCAB}
    mask = {"shape": ["B", "S"], "dtype": "int64", "low": 0 if padded else 1, "high": 2}
    spec = {"input_ids": ids, "attention_mask": mask, "labels": ids}
    return json.dumps({**spec, "dims": {"B": batch, "S": seq}})


def example_inputs() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (2, 32))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
