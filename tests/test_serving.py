"""Serving memory against the truth: tiny real Hugging Face models run with their cache on
the CPU. The cache bytes must match exactly, the prefill peak within 2% of what the
allocator saw (torch.profiler), and the per-token figures the hand formula
2 (K and V) x layers x KV heads x head dim x bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MambaConfig,
    MambaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PretrainedConfig,
)

from inspector.analyze import inspect_model
from inspector.context import Options
from inspector.memory.measure import _ProfilerMeter
from inspector.report import Report
from inspector.serving.cache import cache_of
from inspector.serving.plan import DecodeLine, max_sequences, weight_bytes
from inspector.serving.run import serving_kwargs

GIB = 1024**3


def llama() -> LlamaConfig:  # grouped-query attention: 4 query heads share 2 K/V heads
    return LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=256)  # fmt: skip


def mistral() -> MistralConfig:  # a sliding window of 8 tokens
    return MistralConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         sliding_window=8, max_position_embeddings=256)  # fmt: skip


def gpt2() -> GPT2Config:
    return GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=256)


def mamba() -> MambaConfig:  # state that does not grow with the context
    return MambaConfig(vocab_size=256, hidden_size=32, num_hidden_layers=2, state_size=4,
                       expand=2, conv_kernel=4)  # fmt: skip


CLASSES = {
    "llama": LlamaForCausalLM,
    "mistral": MistralForCausalLM,
    "gpt2": GPT2LMHeadModel,
    "mamba": MambaForCausalLM,
}
CONFIGS = {"llama": llama, "mistral": mistral, "gpt2": gpt2, "mamba": mamba}
S = 24


def report_for(name: str, tmp_path: Path, seq: int = S) -> Report:
    config: PretrainedConfig = CONFIGS[name]()
    config.architectures = [CLASSES[name].__name__]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config.to_dict()))
    spec = {"input_ids": {"shape": ["B", "S"], "dtype": "int64", "high": 256}}
    spec["dims"] = {"B": 1, "S": seq}
    return inspect_model(str(path), json.dumps(spec), Options(passes={"serving"}))


def real_prefill(name: str, seq: int = S) -> tuple[int, int]:
    """(cache bytes, allocator peak) of a real prefill of one sequence on the CPU."""
    torch.manual_seed(0)
    model = CLASSES[name](CONFIGS[name]()).eval()
    meter = _ProfilerMeter()
    with meter.recording():
        with meter.window("setup"):
            ids = torch.randint(0, 256, (1, seq))
        with meter.window("prefill"), torch.no_grad():
            output = model(ids, **serving_kwargs(model))
    cache = sum(_held(layer) for layer in cache_of(output).layers)
    weights = weight_bytes(model).stored
    # the profiler saw the weights allocated before recording began: add them
    return cache, meter.peak("prefill") + weights


def _held(layer: object) -> int:
    """What one cache layer holds, read off its own tensors: keys and values, or an SSM's
    conv and recurrent states (0-dim bookkeeping left out)."""
    values = [v for v in vars(layer).values()]
    values += [x for v in values if isinstance(v, dict) for x in v.values()]  # Mamba: {0: t}
    tensors = [v for v in values if isinstance(v, torch.Tensor) and v.dim()]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("name", ["llama", "mistral", "gpt2", "mamba"])
def test_cache_bytes_exact_and_prefill_peak_within_2_percent(name: str, tmp_path: Path) -> None:
    serving = report_for(name, tmp_path).serving
    assert serving.computed, serving.reason
    cache, peak = real_prefill(name)
    assert serving.cache_bytes_per_sequence == cache
    assert abs(serving.prefill_peak_bytes - peak) / peak <= 0.02, (serving.prefill_peak_bytes, peak)


def test_per_token_figures_by_hand(tmp_path: Path) -> None:
    # Llama: 2 (K, V) x 2 layers x 2 KV heads x 16 head dim x 4 bytes = 512 per token
    assert report_for("llama", tmp_path).serving.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
    # GPT-2 (no GQA): 2 x 2 layers x 4 heads x 16 x 4 = 1024
    gpt = report_for("gpt2", tmp_path).serving
    assert gpt.kv_bytes_per_token == 1024 and gpt.cache_bytes_per_sequence == 1024 * S
    assert gpt.cache_fixed_bytes == 0


def test_sliding_window_layers_stop_growing(tmp_path: Path) -> None:
    serving = report_for("mistral", tmp_path).serving
    # each layer grows by 2 x 2 KV heads x 16 x 4 = 256 bytes a token, up to the window
    assert [layer.bytes_per_token for layer in serving.layers] == [256, 256]
    capped = [layer.capped_at_tokens for layer in serving.layers]
    assert capped == [7, 7]  # transformers keeps window - 1 = 7 past tokens
    assert serving.cache_bytes_per_sequence == 2 * 256 * 7


def test_state_space_cache_does_not_grow(tmp_path: Path) -> None:
    short, long = report_for("mamba", tmp_path, 8).serving, report_for("mamba", tmp_path).serving
    assert long.kv_bytes_per_token == 0 and long.cache_fixed_bytes > 0
    assert short.cache_bytes_per_sequence == long.cache_bytes_per_sequence


def test_max_sequences_by_hand() -> None:
    line = DecodeLine.through(peak_1=1_100, peak_2=1_200)  # fixed 1,000 + 100 per sequence
    assert (line.fixed_bytes, line.per_sequence_bytes) == (1_000, 100)
    # prefill of one more: 1,150 + (n - 1) x 90 <= 2,000 -> n <= 10.4; decode: n <= 10
    assert max_sequences(2_000, prefill_one=1_150, cache_per_sequence=90, line=line) == 10
    assert max_sequences(1_149, prefill_one=1_150, cache_per_sequence=90, line=line) == 0


def test_weight_only_quantised_sizes() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.LayerNorm(128))
    w = weight_bytes(model)
    rest = (128 + 128 + 128) * 4  # linear bias, norm weight and bias stay float32
    assert w.stored == (256 * 128 + 128 + 256) * 4
    assert w.int8 == 256 * 128 + 128 * 2 + rest  # one fp16 scale per output row
    assert w.int4 == 256 * 128 // 2 + 256 * 128 // 128 * 2 + rest  # a scale per 128 weights


def test_no_cache_no_section_unless_asked(tmp_path: Path) -> None:
    model = tmp_path / "m.py"
    model.write_text("from torch import nn\ndef build():\n    return nn.Linear(4, 2)\n")
    spec = '{"input": {"shape": ["B", 4]}, "dims": {"B": 2}}'
    quiet = inspect_model(f"{model}:build", spec, Options(passes={"serving"}))
    assert not quiet.serving.computed and quiet.serving.reason is None
    asked = inspect_model(f"{model}:build", spec, Options(passes={"serving"}, serving=True))
    assert "takes no cache argument" in asked.serving.reason


def test_a_context_past_the_models_positions_is_refused(tmp_path: Path) -> None:
    serving = report_for("gpt2", tmp_path, seq=300).serving  # n_positions = 256
    assert not serving.computed
    assert "S=300 is longer than the 256 positions GPT2LMHeadModel can encode" in serving.reason


@pytest.mark.slow
def test_llama_3_8b_preset_kv_bytes_per_token() -> None:
    report = inspect_model("preset:llama-3-8b", '{"dims": {"B": 1, "S": 4096}}', Options(
        passes={"serving"}))  # fmt: skip
    # 2 (K, V) x 32 layers x 8 KV heads x 128 head dim x 2 bytes (bf16) = 131,072
    assert report.serving.kv_bytes_per_token == 131_072
    assert report.serving.max_concurrent_sequences[str(80 * GIB)] > 0


GENERATE_STEP_MODEL = '''
import torch
from torch import nn


class TinyDecoder(nn.Module):
    """Two attention layers, d=32, 4 heads of 8, keys and values kept in a list."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.qkv = nn.ModuleList(nn.Linear(32, 96) for _ in range(2))
        self.head = nn.Linear(32, 100)

    def forward(self, tokens, cache=None):  # no cache argument a library would recognise
        return generate_step(self, tokens, cache)[0]


def generate_step(model, tokens, cache):
    h = model.embed(tokens)
    cache = cache or [None, None]
    for i, qkv in enumerate(model.qkv):
        q, k, v = qkv(h).split(32, dim=-1)
        b, s, _ = k.shape
        k, v = (t.view(b, s, 4, 8).transpose(1, 2) for t in (k, v))
        if cache[i] is not None:
            k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
        cache[i] = (k, v)
        q = q.view(b, s, 4, 8).transpose(1, 2)
        attention = torch.softmax(q @ k.transpose(-1, -2), -1).matmul(v)
        h = h + attention.transpose(1, 2).reshape(b, s, 32)
    return model.head(h[:, -1:]), cache
'''


def test_a_model_files_generate_step(tmp_path: Path) -> None:
    path = tmp_path / "decoder.py"
    path.write_text(GENERATE_STEP_MODEL)
    tokens = '"tokens": {"shape": ["B", "S"], "dtype": "int64", "high": 100}'
    spec = "{" + tokens + ', "dims": {"B": 1, "S": 16}}'
    serving = inspect_model(f"{path}:TinyDecoder", spec, Options(passes={"serving"})).serving
    assert serving.computed, serving.reason
    # 2 layers x 2 (K, V) x 4 heads x 8 x 4 bytes = 512 bytes a token
    assert serving.kv_bytes_per_token == 512 and serving.cache_bytes_per_sequence == 512 * 16
