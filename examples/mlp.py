"""A small MLP classifier for 28x28 images, with the loss used to train it.

inspector inspect examples/mlp.py:Net --input '{"x": {"shape": ["B", 784]}, "dims": {"B": 64}}'
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self, sizes: tuple[int, ...] = (784, 512, 256, 10)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.net = nn.Sequential(*layers[:-1])  # no ReLU after the last layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


def example_inputs() -> torch.Tensor:
    return torch.randn(32, 784)


def loss_fn(output: torch.Tensor, inputs: object) -> torch.Tensor:
    """Cross-entropy against fixed pseudo-labels (class = row index mod 10)."""
    labels = torch.arange(output.shape[0], device=output.device) % output.shape[1]
    return F.cross_entropy(output, labels)
