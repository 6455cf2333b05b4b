"""Modules inside what fx keeps whole (torch.nn's own TransformerEncoder, MultiheadAttention)
still get their shapes and FLOPs (issue #16: 18 of 23 modules were blank)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector.analyze import inspect_model
from inspector.context import Options

MODEL = '''
from torch import nn


class TinyLM(nn.Module):
    """A 2-layer batch-first TransformerEncoder with a tied embedding / LM head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(32, 100, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)))
'''
SPEC = '{"ids": {"shape": ["B", 16], "dtype": "int64", "high": 100}, "dims": {"B": 2}}'


@pytest.fixture(scope="module")
def modules(tmp_path_factory) -> dict:
    path = Path(tmp_path_factory.mktemp("te")) / "lm.py"
    path.write_text(MODEL)
    report = inspect_model(f"{path}:TinyLM", SPEC, Options(passes={"graph"}))
    return {m.path: m for m in report.modules}


def test_every_module_that_runs_has_shapes(modules) -> None:
    ran = [m for m in modules.values() if m.type not in ("ModuleList",)]
    # out_proj's weight is used by F.multi_head_attention_forward; the module never runs
    blank = [m.path for m in ran if not m.output_shapes]
    assert blank == ["encoder.layers.0.self_attn.out_proj", "encoder.layers.1.self_attn.out_proj"]
    assert modules["encoder.layers.0.linear1"].output_shapes == [["B", 16, 64]]
    assert modules["encoder.layers.1.norm2"].output_shapes == [["B", 16, 32]]


def test_inner_flops_by_hand_and_they_add_up(modules) -> None:
    # linear1: 2 FLOPs x (2 x 16 rows) x 32 in x 64 out = 131,072
    assert modules["encoder.layers.0.linear1"].flops_forward == 2 * 2 * 16 * 32 * 64
    layers = [modules[f"encoder.layers.{i}"].flops_forward for i in (0, 1)]
    assert layers[0] == layers[1] > 0
    assert sum(layers) == modules["encoder"].flops_forward


BRANCHED = '''
import torch
from torch import nn


class Residual(nn.Module):
    """RAFT's residual block: the shortcut is an nn.Identity when the width stays."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.downsample = nn.Identity()

    def forward(self, x):
        # RAFT's correlation scale: fx (also guided by meta values) fails on a tensor made
        # from a size, so torch.export captures
        scale = torch.sqrt(torch.tensor(x.shape[1]))
        return (self.conv(x) + self.downsample(x)) / scale
'''


def test_a_module_that_leaves_no_node_under_export_gets_its_shapes(tmp_path) -> None:
    path = tmp_path / "branched.py"
    path.write_text(BRANCHED)
    spec = '{"x": {"shape": ["B", 4, 8, 8]}, "dims": {"B": 2}}'
    report = inspect_model(f"{path}:Residual", spec, Options(passes={"graph"}))
    assert report.capture.method == "export"
    assert "downsample" not in {n.module_path for n in report.nodes}  # inlined: no node
    down = next(m for m in report.modules if m.path == "downsample")
    assert down.calls == 1 and down.output_shapes == [["B", 4, 8, 8]]
    assert down.flops_forward == 0


CLASS_TOKEN = '''
import torch
from torch import nn


class ClassToken(nn.Module):
    """CaiT's class attention: a learned token, expanded to the batch, queries the patches.
    Under no_grad the expand is a view that says requires_grad with no grad function."""

    def __init__(self):
        super().__init__()
        self.token = nn.Parameter(torch.zeros(1, 1, 16))
        self.attend = nn.TransformerDecoderLayer(16, 2, 32, batch_first=True)

    def forward(self, x):
        return self.attend(self.token.expand(x.shape[0], -1, -1), x)
'''


def test_a_class_token_made_under_no_grad_does_not_stop_the_inner_measures(tmp_path) -> None:
    # torch's FLOP counter sets backward hooks on such a module input, and they raise
    path = tmp_path / "token.py"
    path.write_text(CLASS_TOKEN)
    spec = '{"x": {"shape": ["B", 5, 16]}, "dims": {"B": 2}}'
    report = inspect_model(f"{path}:ClassToken", spec, Options(passes={"graph"}))
    assert report.meta.warnings == []
    linear1 = next(m for m in report.modules if m.path == "attend.linear1")
    assert linear1.calls == 1 and linear1.output_shapes == [["B", 1, 32]]
    # 2 FLOPs x (2 x 1 rows) x 16 in x 32 out
    assert linear1.flops_forward == 2 * 2 * 1 * 16 * 32
