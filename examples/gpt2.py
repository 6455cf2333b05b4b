"""GPT-2 small (124M parameters) built from `transformers.GPT2Config()`: random weights,
nothing downloaded. Inspect it without allocating its weights with --fake:

    inspector inspect examples/gpt2.py:gpt2 --fake \
        --input '{"input_ids": {"shape": ["B", "S"], "dtype": "int64", "high": 50257},
                  "dims": {"B": 4, "S": 512}}'
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 50257


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB))


def example_inputs() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, VOCAB, (2, 64))}
