"""--fake builds models whose constructor computes with tensor values (timm's drop-path
linspace, RegNet's widths): built for real with the weights on the meta device, then
faked; the same parameters and memory as the real model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from inspector.analyze import inspect_model
from inspector.context import Options
from inspector.loaders.fakebuild import building_under, needs_values
from inspector.memory.shadow import new_fake_mode

MODEL = """
import torch
from torch import nn


class DropPathNet(nn.Module):
    def __init__(self, depth: int = 4):
        super().__init__()
        self.rates = torch.linspace(0, 0.1, depth).tolist()  # timm's stochastic depth
        widths = (torch.arange(depth) * 8 + 16).int().tolist()  # 16, 24, 32, 40
        self.stem = nn.Linear(8, widths[0])
        self.blocks = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.head = nn.Linear(widths[-1], 2)
        self.head.weight = nn.Parameter(torch.zeros(2, widths[-1]))
        self.register_buffer("scale", torch.ones(widths[-1]))

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = torch.relu(block(h))
        return self.head(h * self.scale)
"""
SPEC = '{"x": {"shape": ["B", 8]}, "dims": {"B": 4}}'


def test_the_constructor_cannot_run_under_torchs_own_fake_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with building_under(FakeTensorMode(allow_non_fake_inputs=True)):
            torch.linspace(0, 0.1, 4).tolist()
    except Exception as exc:  # noqa: BLE001 - whichever torch raises, it needs values
        assert needs_values(exc)
    else:
        raise AssertionError("fake tensors gave values")


def test_small_values_of_a_constructor_are_kept_under_the_inspectors_fake_mode() -> None:
    with building_under(new_fake_mode()):
        rates = torch.linspace(0, 0.1, 3).tolist()
        widths = (torch.arange(4) * 8 + 16).int().tolist()
        noise = torch.rand(3)  # random floats stay fake: no value to read
        try:
            noise.tolist()
        except Exception as exc:  # noqa: BLE001 - whichever torch raises, it needs values
            assert needs_values(exc)
        else:
            raise AssertionError("random floats got values")
    assert rates == [0.0, 0.05000000074505806, 0.10000000149011612]  # float32 linspace
    assert widths == [16, 24, 32, 40]


def test_fake_build_of_a_value_reading_constructor(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(MODEL)
    options = dict(passes={"graph", "memory"}, measure=False)
    fake = inspect_model(f"{path}:DropPathNet", SPEC, Options(fake=True, **options))
    real = inspect_model(f"{path}:DropPathNet", SPEC, Options(**options))
    # 8*16+16 + 16*24+24 + 24*32+32 + 32*40+40 + 40*2+2 = 2,754
    assert fake.totals.params == real.totals.params == 2754
    assert fake.memory.param_bytes == 2754 * 4
    assert fake.memory.train_peak_bytes == real.memory.train_peak_bytes
    assert fake.meta.fake


def test_fake_build_of_hugging_face_convnext(tmp_path: Path) -> None:
    """transformers' ConvNeXt reads `torch.linspace(0, rate, depth).tolist()` too."""
    from transformers import ConvNextConfig

    config = ConvNextConfig(depths=[1, 1, 2, 1], hidden_sizes=[8, 16, 24, 32],
                            drop_path_rate=0.1, num_labels=3)  # fmt: skip
    config.architectures = ["ConvNextForImageClassification"]
    path = tmp_path / "config.json"
    path.write_text(config.to_json_string())
    fake = inspect_model(str(path), None, Options(fake=True, passes={"graph"}))
    real = inspect_model(str(path), None, Options(passes={"graph"}))
    assert fake.status == "done" and fake.totals.params == real.totals.params > 0


def test_transformers_imported_while_building_fake_keeps_torchs_initialisers() -> None:
    """A model file that imports transformers as it builds does so inside `skip_init`,
    and transformers copies torch's initialisers into its own table at import: the
    no-ops then stayed there, and every later real build in the process (`--fake`'s real
    copy) kept uninitialised weights. In a fresh interpreter, where transformers is not
    imported yet."""
    code = (
        "import torch\n"
        "from inspector.loaders.fakebuild import skip_init\n"
        "with skip_init():\n"
        "    import transformers.initialization as ti\n"
        "    inside = ti.TORCH_INIT_FUNCTIONS['normal_'].__name__\n"
        "table = ti.TORCH_INIT_FUNCTIONS\n"
        "after = all(fn is getattr(torch.nn.init, name) for name, fn in table.items())\n"
        "print(inside, after, len(table))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    ).stdout.split()
    assert out[:2] == ["_keep", "True"] and int(out[2]) >= 5  # no-ops inside, torch's after
