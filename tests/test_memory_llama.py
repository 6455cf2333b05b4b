"""A Llama-style decoder with 70B dimensions, built inside a FakeTensorMode: the memory
analysis allocates no weights, stays small in RSS, and its per-layer saved activations
match the formula worked out by hand (Korthikanti et al. 2022, adjusted for Llama)."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
import torch

from inspector.context import Context, InputFactory, Inputs, LoadedModel, Options
from inspector.loaders.fakebuild import building_under
from inspector.memory.advice import subtree_bytes
from inspector.memory.shadow import new_fake_mode
from inspector.passes import memory as memory_pass
from inspector.report import Report


class _Ids(InputFactory):
    def __init__(self, seq: int, vocab: int) -> None:
        super().__init__({"B": 1})
        self.seq, self.vocab = seq, vocab

    def build(self, dims: dict[str, int] | None = None, device: str = "cpu") -> Inputs:
        b = (dims or {}).get("B", 1)
        return Inputs((), {"input_ids": torch.randint(0, self.vocab, (b, self.seq))}, {"B": b})

    @property
    def batch_dim(self) -> str:
        return "B"


def _llama(layers: int, h: int, heads: int, kv: int, ffn: int, vocab: int, seq: int) -> Context:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=h,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=ffn,
        vocab_size=vocab,
        max_position_embeddings=seq,
    )
    config._attn_implementation = "sdpa"
    mode = new_fake_mode()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with building_under(mode):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    factory = _Ids(seq, vocab)
    with mode:
        inputs = factory.build()
    return Context(
        LoadedModel(model, "hf-config", "llama", fake_mode=mode),
        factory,
        inputs,
        Options(fake=True),
        Report(),
        fake_mode=mode,
    )


def layer_bytes_by_hand(s: int, b: int, h: int, a: int, kv: int, f: int) -> int:
    """Saved bytes of one Llama layer, bf16, SDPA (flash on CPU), by hand.

    RMSNorm x2: float32 input copy 4sbh + bf16 normalised 2sbh + output 2sbh + rsqrt 4bs
    attention: q 2sbh, k and v 2sb(h*kv/a) each, output 2sbh, logsumexp float32 4bas
    SwiGLU: gate, silu(gate), up, product: 4 * 2sbf
    """
    norms = 2 * (8 * s * b * h + 4 * b * s)
    attention = 2 * s * b * h + 2 * 2 * s * b * (h * kv // a) + 2 * s * b * h + 4 * b * a * s
    return norms + attention + 8 * s * b * f


def test_small_llama_layer_matches_hand_formula():
    ctx = _llama(layers=2, h=256, heads=8, kv=2, ffn=704, vocab=1000, seq=128)
    memory_pass.run(ctx)
    per_layer = subtree_bytes(ctx.results.memory.train.saved_by_label)["model.layers.1"]
    assert per_layer == layer_bytes_by_hand(s=128, b=1, h=256, a=8, kv=2, f=704)


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: resets VmHWM


def _peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.mark.slow
def test_llama_70b_dims_on_fake_tensors_stays_small():
    # 70B dimensions, 2 of the 80 layers: 7.1 GiB of bf16 weights would be real memory.
    ctx = _llama(layers=2, h=8192, heads=64, kv=8, ffn=28672, vocab=128256, seq=4096)
    try:
        _reset_peak_rss()
    except OSError:
        pytest.skip("cannot reset the peak RSS here")
    before = _peak_rss()
    memory_pass.run(ctx)
    assert _peak_rss() - before < 1024**3  # far below 4 GiB; the weights alone are 7.1 GiB
    mem = ctx.report.memory
    assert mem.param_bytes > 7 * 1024**3
    per_layer = subtree_bytes(ctx.results.memory.train.saved_by_label)["model.layers.1"]
    assert per_layer == layer_bytes_by_hand(s=4096, b=1, h=8192, a=64, kv=8, f=28672)
    assert mem.max_batch and mem.fixed_bytes and mem.per_sample_bytes
