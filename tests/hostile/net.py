"""The harmless model every hostile upload ends with (pasted after its hostile part)."""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)


def example_inputs():
    return (torch.randn(2, 8),)
