"""From measured serving steps to concurrency: how many sequences of a given context fit.

Sequences arrive one at a time: the prefill of a new one runs while the others' caches
are resident, so it needs `prefill_one + (n - 1) * cache_per_sequence`; then all n decode
together, `decode_fixed + n * decode_per_sequence` (a line through decode steps measured
at two batch sizes: the cache, the logits and the activations of each sequence). The
largest n that keeps both within the budget is the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from inspector.memory.step import unique_tensors

__all__ = ["DecodeLine", "WeightBytes", "max_sequences", "weight_bytes", "INT4_GROUP"]

INT4_GROUP = 128  # weights per fp16 scale in group-wise int4 (GPTQ/AWQ-style)


@dataclass(frozen=True)
class DecodeLine:
    fixed_bytes: int
    per_sequence_bytes: int

    @classmethod
    def through(cls, peak_1: int, peak_2: int) -> DecodeLine:
        return cls(peak_1 - (peak_2 - peak_1), peak_2 - peak_1)

    def at(self, n: int) -> int:
        return self.fixed_bytes + n * self.per_sequence_bytes


def max_sequences(budget: int, prefill_one: int, cache_per_sequence: int, line: DecodeLine) -> int:
    """The most sequences that prefill one by one and then decode together in `budget`."""
    if budget < prefill_one or budget < line.at(1) or line.per_sequence_bytes <= 0:
        return 0
    by_prefill = 1 + (budget - prefill_one) // max(cache_per_sequence, 1)
    by_decode = (budget - line.fixed_bytes) // line.per_sequence_bytes
    return int(min(by_prefill, by_decode))


@dataclass(frozen=True)
class WeightBytes:
    stored: int  # parameters and buffers as they are, each storage once
    by_dtype: dict[str, int]
    int8: int  # weight-only int8
    int4: int  # weight-only int4


def weight_bytes(model: nn.Module) -> WeightBytes:
    """Bytes of the weights as stored, by dtype, and weight-only int8 / int4 sizes.

    Quantised: every nn.Linear weight (int8 with one fp16 scale per output row; int4 packed
    two per byte with one fp16 scale per group of 128), everything else as it is.
    """
    by_dtype: dict[str, int] = {}
    for t in unique_tensors([*model.parameters(), *model.buffers()]):
        key = str(t.dtype).removeprefix("torch.")
        by_dtype[key] = by_dtype.get(key, 0) + t.numel() * t.element_size()
    stored = sum(by_dtype.values())
    linear = unique_tensors(m.weight for m in model.modules() if isinstance(m, nn.Linear))
    linear_bytes = sum(w.numel() * w.element_size() for w in linear)
    int8 = sum(w.numel() + w.shape[0] * 2 for w in linear)
    int4 = sum(-(-w.numel() // 2) + -(-w.numel() // INT4_GROUP) * 2 for w in linear)
    return WeightBytes(stored, by_dtype, stored - linear_bytes + int8, stored - linear_bytes + int4)
