"""A submodule wrapped in torch.compile is analysed as its original module: its compiled
kernels used to run on fake tensors (a device mismatch blamed on the user's input, or a
segfault), and the report now says what was unwrapped."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector.analyze import inspect_model
from inspector.context import Options

MODEL = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.block = torch.compile(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8)))

    def forward(self, x):
        return self.block(self.stem(x))


def example_inputs():
    return torch.randn(4, 16)
"""


@pytest.mark.parametrize("fake", [True, False])
def test_compiled_block_is_analysed_as_its_original_module(tmp_path: Path, fake: bool) -> None:
    path = tmp_path / "compiled.py"
    path.write_text(MODEL)
    report = inspect_model(
        f"{path}:Net", None, Options(fake=fake, passes={"graph", "memory"}, measure=False)
    )
    # 2 * (4*16*32 + 4*32*32 + 4*32*8) = 2 * (2048 + 4096 + 1024) = 14336
    assert report.totals.flops_forward == 14336
    assert [m.path for m in report.modules] == [
        "",
        "stem",
        "block",
        "block.0",
        "block.1",
        "block.2",
    ]
    assert report.memory.train_peak_bytes
    assert any("`block`: wrapped in torch.compile" in w for w in report.meta.warnings)


def test_unwrap_compiled_at_the_root_and_nested() -> None:
    import torch
    from torch import nn

    from inspector.loaders.compiled import unwrap_compiled

    inner = nn.Sequential(nn.Linear(2, 2), torch.compile(nn.ReLU()))
    model, paths = unwrap_compiled(torch.compile(inner))
    assert model is inner and paths == ["", "1"]
    assert type(model[1]) is nn.ReLU
