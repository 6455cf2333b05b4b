"""Models for the export-readiness tests (their line numbers are asserted: keep them stable)."""

from __future__ import annotations

import torch
from torch import nn


class Clean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.mean() > 0:  # BRANCH_LINE: data-dependent control flow
            return self.fc(x)
        return -self.fc(x)


class Unscriptable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:  # TorchScript has no try/except
            return self.fc(x)
        except RuntimeError:
            return x


class SizeBranch(nn.Module):
    """A branch on the batch size: a trace keeps the side the sample took."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 4:
            return self.fc(x)
        return -self.fc(x)


class BakedBatch(nn.Module):
    """Reads the batch size as a Python int: exporters specialise the batch to it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).reshape(int(x.shape[0]), 2, 2)
