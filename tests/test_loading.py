"""Model loading: Python files, .pt2 archives, TorchScript, refusals, and every LoadError."""

from __future__ import annotations

import hashlib
import os
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from models import GPT2_PARAMS, RESNET18_PARAMS
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from inspector.errors import LoadError
from inspector.loaders.load import load_model

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def line_of(path: Path, needle: str) -> int:
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


def fake_mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=True)


# --- Python files -------------------------------------------------------------------------


def test_class_entrypoint_with_example_inputs_and_loss_fn() -> None:
    path = EXAMPLES / "mlp.py"
    loaded = load_model(f"{path}:Net")
    assert type(loaded.model).__name__ == "Net"
    assert (loaded.source_kind, loaded.entrypoint) == ("python", "Net")
    assert loaded.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert loaded.user_files == [str(EXAMPLES.resolve())]
    inputs = loaded.inputs.build()
    assert [t.shape for t in inputs.tensors()] == [(32, 784)]
    loss = loaded.loss_fn(inputs.call(loaded.model), inputs)
    assert loss.shape == () and loss.item() > 0


def test_factory_entrypoint_builds_resnet18() -> None:
    loaded = load_model(f"{EXAMPLES / 'resnet.py'}:resnet18")
    assert sum(p.numel() for p in loaded.model.parameters()) == RESNET18_PARAMS
    assert loaded.inputs.build().args[0].shape == (2, 3, 224, 224)


def test_sibling_modules_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkgdir"
    pkg.mkdir()
    write(pkg, "h1_sibling_layers.py", "from torch import nn\nWIDTH = 5\n")
    write(
        pkg,
        "model.py",
        """
        from torch import nn
        from h1_sibling_layers import WIDTH

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(WIDTH, 2)
        """,
    )
    loaded = load_model(f"{pkg / 'model.py'}:Net")
    assert loaded.model.fc.in_features == 5
    assert loaded.user_files == [str(pkg.resolve())]
    assert loaded.inputs is None and loaded.loss_fn is None


def test_each_load_is_a_fresh_module(tmp_path: Path) -> None:
    path = write(
        tmp_path, "m.py", "from torch import nn\ndef build():\n    return nn.Linear(2, 3)\n"
    )
    first, second = load_model(f"{path}:build"), load_model(f"{path}:build")
    assert first.model is not second.model
    assert type(first.model) is nn.Linear


def test_dict_example_inputs_become_kwargs(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "kw.py",
        """
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)
            def forward(self, x, scale=1.0):
                return self.fc(x) * scale

        def example_inputs():
            return (torch.ones(3, 4),), {"scale": 2.0}
        """,
    )
    inputs = load_model(f"{path}:Net").inputs.build()
    assert inputs.args[0].shape == (3, 4) and inputs.kwargs == {"scale": 2.0}


# --- fake construction --------------------------------------------------------------------


def test_fake_construction_of_linear_and_conv(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "big.py",
        """
        from torch import nn

        def build():
            return nn.Sequential(nn.Conv2d(3, 64, 3), nn.Flatten(), nn.Linear(64, 100_000))
        """,
    )
    loaded = load_model(f"{path}:build", fake_mode=fake_mode())
    params = list(loaded.model.parameters())
    assert params and all(isinstance(p, FakeTensor) for p in params)
    assert params[2].shape == (100_000, 64)
    assert loaded.model[0].weight.shape == (64, 3, 3, 3)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_fake_gpt2_allocates_no_weights() -> None:
    import transformers  # noqa: F401 - import cost outside the measurement

    before = _rss_bytes()
    loaded = load_model(f"{EXAMPLES / 'gpt2.py'}:gpt2", fake_mode=fake_mode())
    grown = _rss_bytes() - before
    params = list(loaded.model.parameters())
    assert all(isinstance(p, FakeTensor) for p in params)
    assert sum(p.numel() for p in params) == GPT2_PARAMS
    # Real weights would be GPT2_PARAMS * 4 bytes = 497,759,232 bytes; allow 1/5 of it.
    assert grown < GPT2_PARAMS * 4 // 5, grown


# --- errors -------------------------------------------------------------------------------


def test_missing_file() -> None:
    with pytest.raises(LoadError, match="not found: .*nope.py"):
        load_model("nope.py:Net")


def _two_candidates(tmp_path: Path) -> Path:
    return write(
        tmp_path,
        "model.py",
        """
        from torch import nn

        class Net(nn.Module):
            pass

        class Block(nn.Module):
            def __init__(self, width):
                super().__init__()

        def build():
            return Net()

        def example_inputs():
            return None
        """,
    )


def test_missing_entrypoint_lists_candidates(tmp_path: Path) -> None:
    path = _two_candidates(tmp_path)
    with pytest.raises(LoadError) as info:
        load_model(f"{path}:make_model")
    text = str(info.value)
    assert "entrypoint 'make_model' not found in model.py (defined: Net, Block, build)" in text
    assert "Use model.py:Net or model.py:build." in text  # Block needs an argument


def test_no_entrypoint_lists_candidates(tmp_path: Path) -> None:
    path = _two_candidates(tmp_path)
    with pytest.raises(LoadError, match=r"no entrypoint given for model.py \(defined: Net"):
        load_model(str(path))


def test_syntax_error_gives_file_line_and_text(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.py", "import torch\n\ndef build(:\n    pass\n")
    with pytest.raises(LoadError) as info:
        load_model(f"{path}:build")
    assert info.value.location == "broken.py:3"
    assert "def build(:" in str(info.value)


def test_exception_while_importing_shows_user_frames(tmp_path: Path) -> None:
    path = write(tmp_path, "imp.py", "import torch\n\nSIZE = {}['missing']\n")
    with pytest.raises(LoadError) as info:
        load_model(f"{path}:build")
    assert info.value.location == "imp.py:3"
    assert "KeyError" in str(info.value) and "importing imp.py" in str(info.value)
    assert "imp.py" in info.value.user_traceback
    assert "inspector/" not in info.value.user_traceback  # only the user's frames


def test_exception_in_constructor_points_at_the_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "ctor.py",
        """
        from torch import nn

        class Net(nn.Module):
            def __init__(self, width=4):
                super().__init__()
                self.fc = nn.Linear(width, width // 0)
        """,
    )
    with pytest.raises(LoadError) as info:
        load_model(f"{path}:Net")
    assert info.value.location == f"ctor.py:{line_of(path, 'width // 0')}"
    assert "ZeroDivisionError" in str(info.value) and "building Net()" in str(info.value)


def test_constructor_needing_arguments_names_them(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "args.py",
        """
        from torch import nn

        class Net(nn.Module):
            def __init__(self, in_dim, out_dim, bias=True):
                super().__init__()
        """,
    )
    with pytest.raises(LoadError, match=r"Net\(\) in args.py needs arguments: in_dim, out_dim\."):
        load_model(f"{path}:Net")


def test_entrypoint_returning_something_else(tmp_path: Path) -> None:
    path = write(tmp_path, "notmod.py", "def build():\n    return 42\n")
    with pytest.raises(LoadError, match=r"build\(\) in notmod.py returned a int, not an nn.Module"):
        load_model(f"{path}:build")


def test_pkl_and_whole_pickled_module_are_refused(tmp_path: Path) -> None:
    pkl = tmp_path / "model.pkl"
    pkl.write_bytes(b"\x80\x04N.")
    with pytest.raises(LoadError, match="pickle file"):
        load_model(str(pkl))
    whole = tmp_path / "model.pt"
    torch.save(nn.Linear(2, 2), whole)  # a whole module: loading it would unpickle code
    with pytest.raises(LoadError, match=r"pickled object \(torch.save\).*refused") as info:
        load_model(str(whole))
    assert "torch.export" in str(info.value)


def test_unknown_source_kind(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"onnx")
    with pytest.raises(LoadError, match="don't know how to load"):
        load_model(str(path))


def test_preset_and_config_dispatch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = []
    presets = types.ModuleType("inspector.loaders.presets")
    presets.load_preset = lambda name, **kw: calls.append(("preset", name, kw)) or "P"
    hfconfig = types.ModuleType("inspector.loaders.hfconfig")
    hfconfig.load_config = lambda path, **kw: calls.append(("config", path, kw)) or "C"
    monkeypatch.setitem(sys.modules, "inspector.loaders.presets", presets)
    monkeypatch.setitem(sys.modules, "inspector.loaders.hfconfig", hfconfig)
    config = tmp_path / "config.json"
    config.write_text("{}")
    assert load_model("preset:gpt2-small") == "P"
    assert load_model(str(config), device="cpu") == "C"
    kw = {"fake_mode": None, "device": "cpu"}
    assert calls == [("preset", "gpt2-small", kw), ("config", str(config), kw)]


# --- saved programs -----------------------------------------------------------------------


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def test_pt2_round_trip(tmp_path: Path) -> None:
    model, x = Tiny(), torch.randn(5, 4)
    path = tmp_path / "tiny.pt2"
    torch.export.save(torch.export.export(model, (x,)), path)
    loaded = load_model(str(path))
    assert loaded.source_kind == "pt2" and loaded.exported is not None
    assert loaded.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    inputs = loaded.inputs.build()
    assert torch.equal(inputs.args[0], x)
    assert inputs.args[0] is not loaded.inputs.build().args[0]  # each build is a copy
    torch.testing.assert_close(inputs.call(loaded.model), model(x))


def test_pt2_inputs_under_fake_mode_are_fake(tmp_path: Path) -> None:
    path = tmp_path / "tiny.pt2"
    torch.export.save(torch.export.export(Tiny(), (torch.randn(5, 4),)), path)
    loaded = load_model(str(path))
    with fake_mode():
        arg = loaded.inputs.build().args[0]
    assert isinstance(arg, FakeTensor) and arg.shape == (5, 4)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_torchscript_round_trip(tmp_path: Path) -> None:
    model, x = Tiny(), torch.randn(2, 4)
    path = tmp_path / "tiny.pt"  # a TorchScript zip, recognised by its contents
    torch.jit.script(model).save(str(path))
    loaded = load_model(str(path))
    assert loaded.source_kind == "torchscript" and loaded.inputs is None
    torch.testing.assert_close(loaded.model(x), model(x))


def test_corrupt_archive(tmp_path: Path) -> None:
    path = tmp_path / "junk.pt2"
    path.write_bytes(b"not a zip at all")
    with pytest.raises(LoadError, match="neither a torch.export archive"):
        load_model(str(path))
