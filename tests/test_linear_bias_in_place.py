"""F.linear on an input it cannot fold into one addmm (a 3-D one that is not contiguous,
4-D and up) is `matmul` then `output.add_(bias)`, in place; under a dispatch mode or on
fake tensors PyTorch adds out of place, so the memory estimate counted the matmul's output
and the sum together. Against the measured step (the profiler's allocator events, no mode):
a batch-first GRU's input projection (its input transposed: the inference peak was 153,740
B against 133,260), a Linear on a 4-D input (its peak is elsewhere), and a hand-written
`x @ w + b`, which is out of place for real too: the estimate must not drop it."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from inspector.analyze import inspect_model
from inspector.context import Options


class BatchFirstGru(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.fc = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.fc(out[:, -1])


class ChannelsLastLinear(nn.Module):
    """ConvNeXt's pointwise layers: Linear over the channels of [B, H, W, C]."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x.permute(0, 2, 3, 1))))


class HandWritten(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(16, 32)), nn.Parameter(torch.zeros(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.matmul(x.transpose(0, 1), self.w) + self.b).sum(0)


@pytest.mark.parametrize(
    ("name", "shape"),
    [("BatchFirstGru", [8, 20, 16]), ("ChannelsLastLinear", [2, 8, 12, 12]),
     ("HandWritten", [6, 20, 16])],
)  # fmt: skip
def test_the_forward_peak_is_the_measured_one(name: str, shape: list[int]) -> None:
    spec = json.dumps({"x": {"shape": shape}})
    report = inspect_model(f"{__file__}:{name}", spec, Options(passes={"memory"}, isolate=False))
    memory = report.memory
    assert memory.forward_peak_bytes == memory.measured.forward_peak_bytes
    assert memory.train_peak_bytes == memory.measured.train_peak_bytes
