"""check_inputs_fit: the layer that rejects the inputs is named, with what it expects."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from models import DataDependent, EmbeddingBag
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from inspector.context import Inputs
from inspector.errors import InputMismatchError, UserCodeError
from inspector.fit import check_inputs_fit, expectation
from inspector.loaders.load import load_model

EXAMPLES = Path(__file__).parent.parent / "examples"


def line_of(path: Path, needle: str) -> int:
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


def mismatch(model: nn.Module, inputs: Inputs, user_files: list[str] | None = None) -> str:
    with pytest.raises(InputMismatchError) as info:
        check_inputs_fit(model, inputs, user_files or [])
    return str(info.value)


def test_resnet18_with_four_channels_names_conv1() -> None:
    loaded = load_model(f"{EXAMPLES / 'resnet.py'}:resnet18")
    with pytest.raises(InputMismatchError) as info:
        check_inputs_fit(loaded.model, Inputs((torch.randn(2, 4, 32, 32),)), loaded.user_files)
    text = str(info.value)
    assert "do not fit `conv1`: Conv2d(3, 64, kernel_size=(7, 7)" in text
    assert "it received: float32[2, 4, 32, 32]" in text
    assert "3 channels on dim 1 (in_channels=3)" in text
    assert "to have 3 channels, but got 4 channels instead" in text  # torch's own message
    line = line_of(EXAMPLES / "resnet.py", "self.maxpool(self.relu(self.bn1(self.conv1(x))))")
    assert info.value.location == f"resnet.py:{line}"
    assert "ResNet (root) > conv1 (Conv2d)" in text


def test_resnet18_with_four_channels_under_fake_mode() -> None:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    loaded = load_model(f"{EXAMPLES / 'resnet.py'}:resnet18", fake_mode=mode)
    with mode:
        inputs = Inputs((torch.randn(8, 4, 224, 224),))
        text = mismatch(loaded.model, inputs, loaded.user_files)
    assert "`conv1`" in text and "float32[8, 4, 224, 224]" in text and "in_channels=3" in text


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(32, 4)  # wrong: body gives 16 features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


@pytest.mark.parametrize("fake", [False, True])
def test_names_the_linear_whose_in_features_do_not_match(fake: bool) -> None:
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
    with mode or torch.device("cpu"):
        model, inputs = TwoLayers(), Inputs((torch.randn(5, 8),))
        text = mismatch(model, inputs)
    assert "do not fit `head`: Linear(in_features=32, out_features=4, bias=True)" in text
    assert "it received: float32[5, 16]" in text
    assert "last dim = 32 (in_features=32)" in text


def test_embedding_ids_out_of_range() -> None:
    ids = torch.tensor([[3, 999, 1000, 1200]])  # num_embeddings = 1000: ids 1000+ are too big
    text = mismatch(EmbeddingBag(), Inputs((ids,)))
    assert "`emb`" in text and "integer ids in [0, 1000)" in text
    assert "got ids in [3, 1200]" in text


def test_float_ids_into_embedding() -> None:
    text = mismatch(EmbeddingBag(), Inputs((torch.randn(2, 5),)))
    assert "`emb`" in text and "got float32 values" in text


def test_fp16_input_into_fp32_linear_notes_the_weight_dtype() -> None:
    text = mismatch(TwoLayers(), Inputs((torch.randn(2, 8, dtype=torch.float16),)))
    assert "`body`" in text and "its weight is float32" in text


def write(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "usermodel.py"
    path.write_text(textwrap.dedent(source))
    return path


USER_MODEL = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 3)

        def forward(self, x, mode="ok"):
            if mode == "raise":
                raise ValueError("mode 'raise' is not supported")
            if mode == "typo":
                return self.fc(undefined_name)
            h = x.view(-1, 12)
            return self.fc(h)
    """


def test_shape_error_in_user_code_points_at_their_line(tmp_path: Path) -> None:
    path = write(tmp_path, USER_MODEL)
    loaded = load_model(f"{path}:Net")
    with pytest.raises(InputMismatchError) as info:
        check_inputs_fit(loaded.model, Inputs((torch.randn(5, 5),)), loaded.user_files)
    assert info.value.location == f"usermodel.py:{line_of(path, 'x.view(-1, 12)')}"
    assert "is invalid for input of size 25" in str(info.value)
    assert "the model (Net)" in str(info.value)


@pytest.mark.parametrize(("mode", "kind"), [("raise", "ValueError"), ("typo", "NameError")])
def test_user_code_errors_are_not_mismatches(tmp_path: Path, mode: str, kind: str) -> None:
    path = write(tmp_path, USER_MODEL)
    loaded = load_model(f"{path}:Net")
    with pytest.raises(UserCodeError) as info:
        check_inputs_fit(loaded.model, Inputs((torch.randn(2, 12),), {"mode": mode}), [str(path)])
    needle = "raise ValueError" if mode == "raise" else "undefined_name"
    assert info.value.location == f"usermodel.py:{line_of(path, needle)}"
    assert kind in str(info.value) and "running Net.forward" in str(info.value)
    assert "usermodel.py" in info.value.user_traceback


def test_fitting_inputs_pass_and_leave_batchnorm_statistics_alone() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    before = model[1].running_mean.clone(), int(model[1].num_batches_tracked)
    check_inputs_fit(model, Inputs((torch.randn(2, 3, 8, 8) + 5,)), [])
    assert torch.equal(model[1].running_mean, before[0])
    assert int(model[1].num_batches_tracked) == before[1] == 0
    assert model[0]._forward_pre_hooks == {} and model[0]._forward_hooks == {}  # removed


def test_data_dependent_control_flow_under_fake_mode_is_not_a_mismatch() -> None:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model, inputs = DataDependent(), Inputs((torch.randn(4, 8),))
        check_inputs_fit(model, inputs, [])  # `if h.sum() > 0` cannot be decided: ignored


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        (nn.LayerNorm([16, 32]), "trailing dims [16, 32] (normalized_shape=(16, 32))"),
        (nn.BatchNorm1d(7), "7 channels on dim 1 (num_features=7)"),
        (nn.Conv1d(5, 2, 3), "5 channels on dim 1 (in_channels=5) of an input [N, C, L]"),
        (nn.GroupNorm(2, 6), "6 channels on dim 1 (num_channels=6)"),
        (nn.ReLU(), None),
    ],
)
def test_expectations_of_common_layers(module: nn.Module, expected: str | None) -> None:
    assert expectation(module, [torch.randn(2, 3)]) == expected


def test_layernorm_mismatch_message() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(6))
    text = mismatch(model, Inputs((torch.randn(3, 4),)))
    assert "`1`: LayerNorm((6,)" in text and "it received: float32[3, 8]" in text
    assert "trailing dims [6]" in text
