"""A model file whose loss_fn cuts the graph (tests/test_rules.py asserts the line)."""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.aux = nn.Linear(4, 3), nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.body(x), self.aux(x)


def example_inputs() -> tuple[torch.Tensor]:
    return (torch.randn(8, 4),)


def loss_fn(output: tuple[torch.Tensor, torch.Tensor], inputs: object) -> torch.Tensor:
    out, aux = output
    target = torch.zeros_like(out)
    loss = (out.detach() - target).pow(2).mean()  # CUT-LINE: the body never trains
    return loss + 0.1 * aux.pow(2).mean()
