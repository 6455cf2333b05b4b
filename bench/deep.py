"""A deep stack of small residual blocks: 200 blocks of norm -> linear -> GELU -> linear ->
add give a graph of about 1,000 nodes with little compute, so a report's cost per node
shows (bench/pipeline.py's 1,000-node case).

    inspector inspect bench/deep.py:deep_stack \
        --input '{"x": {"shape": ["B", 32]}, "dims": {"B": 16}}'
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class DeepStack(nn.Module):
    def __init__(self, blocks: int, dim: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def deep_stack(blocks: int = 200, dim: int = 32) -> nn.Module:
    """`blocks` residual blocks of width `dim`: 5 graph nodes each, plus input and output."""
    torch.manual_seed(0)
    return DeepStack(blocks, dim)


def example_inputs() -> torch.Tensor:
    return torch.randn(16, 32)
