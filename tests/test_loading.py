"""Model loading: Python files and packages, .pt2 archives, TorchScript, refusals, every
LoadError."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from models import GPT2_PARAMS, RESNET18_PARAMS
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from inspector.errors import LoadError
from inspector.loaders.load import load_model
from inspector.loaders.userimports import forget_user_modules

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


# --- packages: a file inside a package is imported as part of it -----------------------

LAYERS = """
from torch import nn

WIDTH = 4

class Block(nn.Module):
    def __init__(self, out=3):
        super().__init__()
        self.fc = nn.Linear(WIDTH, out)

    def forward(self, x):
        return self.fc(x)
"""


def model_source(import_line: str, block: str = "Block()") -> str:
    """A model.py whose Net wraps a Block that `import_line` brings."""
    return (
        f"from torch import nn\n{import_line}\n\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        f"        self.block = {block}\n\n"
        "    def forward(self, x):\n"
        "        return self.block(x)\n"
    )


def make_tree(root: Path, files: dict[str, str]) -> Path:
    """Write `files` ({"mypkg/model.py": source, ...}) under `root`."""
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root


def package(root: Path, model: str, name: str = "mypkg", layers: str = LAYERS) -> Path:
    """`root/name/{__init__,layers,model}.py`; returns the model file."""
    make_tree(root, {f"{name}/__init__.py": "", f"{name}/layers.py": layers,
                     f"{name}/model.py": model})  # fmt: skip
    return root / name / "model.py"


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(autouse=True)
def no_user_modules_left() -> Iterator[None]:
    """Every test leaves sys.modules and sys.path as it found them."""
    yield
    forget_user_modules()


@pytest.mark.parametrize(
    ("import_line", "block"),
    [
        ("from mypkg.layers import Block", "Block()"),
        ("from .layers import Block", "Block()"),
        ("from . import layers", "layers.Block()"),
        ("import mypkg.layers", "mypkg.layers.Block()"),
        ("from layers import Block", "Block()"),  # as when run as a script: still works
    ],
)
def test_package_absolute_and_relative_imports(tmp_path: Path, import_line: str, block: str):
    path = package(tmp_path, model_source(import_line, block))
    loaded = load_model(f"{path}:Net")
    assert n_params(loaded.model) == 4 * 3 + 3  # Linear(4, 3): weight + bias = 15
    assert type(loaded.model).__module__ == "mypkg.model"
    assert loaded.user_files == [str(tmp_path.resolve())]  # what sits beside the package too
    assert loaded.model(torch.ones(2, 4)).shape == (2, 3)


def test_nested_package_imports_up_and_across(tmp_path: Path) -> None:
    make_tree(tmp_path, {
        "mypkg/__init__.py": "", "mypkg/layers.py": LAYERS, "mypkg/sub/__init__.py": "",
        "mypkg/sub/heads.py": "from torch import nn\n\ndef head():\n    return nn.Linear(3, 2)\n",
        "mypkg/sub/model.py": model_source(
            "from ..layers import Block\nfrom mypkg.sub.heads import head",
            "nn.Sequential(Block(), head())",
        ),
    })  # fmt: skip
    loaded = load_model(f"{tmp_path / 'mypkg' / 'sub' / 'model.py'}:Net")
    assert type(loaded.model).__module__ == "mypkg.sub.model"
    assert n_params(loaded.model) == (4 * 3 + 3) + (3 * 2 + 2)  # 15 + 8 = 23


def test_modules_beside_the_package_import_like_vendored_libraries(tmp_path: Path) -> None:
    make_tree(tmp_path, {"vendored/__init__.py": "OUT = 5\n"})
    source = model_source("from .layers import Block\nfrom vendored import OUT", "Block(OUT)")
    loaded = load_model(f"{package(tmp_path, source)}:Net")
    assert n_params(loaded.model) == 4 * 5 + 5  # Linear(4, OUT=5) = 25


def test_src_layout(tmp_path: Path) -> None:
    path = package(tmp_path / "src", model_source("from mypkg.layers import Block"))
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'mypkg'\n")
    loaded = load_model(f"{path}:Net")
    assert n_params(loaded.model) == 15  # Linear(4, 3), as above
    assert loaded.user_files == [str((tmp_path / "src").resolve())]


def test_package_named_like_a_module_already_imported_is_the_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `models` here is tests/models.py, imported by this very module; `utils` a stand-in
    # for some other `utils` imported before the load.
    import models as tests_models

    other_utils = types.ModuleType("utils")
    monkeypatch.setitem(sys.modules, "utils", other_utils)
    make_tree(tmp_path, {
        "utils/__init__.py": "", "utils/layers.py": LAYERS.replace("WIDTH = 4", "WIDTH = 6"),
        "models/__init__.py": "",
        "models/model.py": model_source("from utils.layers import Block"),
    })  # fmt: skip
    loaded = load_model(f"{tmp_path / 'models' / 'model.py'}:Net")
    assert n_params(loaded.model) == 6 * 3 + 3  # the user's utils: Linear(6, 3) = 21
    assert sys.modules["models"].__file__ == str((tmp_path / "models" / "__init__.py").resolve())
    forget_user_modules()  # what the next load does first
    assert sys.modules["models"] is tests_models and sys.modules["utils"] is other_utils


def test_a_package_named_like_torch_is_refused(tmp_path: Path) -> None:
    path = package(tmp_path, model_source("from .layers import Block"), name="torch")
    with pytest.raises(LoadError, match=r"package named 'torch', like the module 'torch'") as info:
        load_model(f"{path}:Net")
    assert "Rename the folder torch/" in str(info.value)
    assert sys.modules["torch"] is torch


def test_two_uploads_with_the_same_package_name_each_get_their_own(tmp_path: Path) -> None:
    first = package(tmp_path / "a", model_source("from .layers import Block"))
    wider = LAYERS.replace("WIDTH = 4", "WIDTH = 8")
    second = package(tmp_path / "b", model_source("from mypkg.layers import Block"), layers=wider)
    path_before = list(sys.path)
    assert n_params(load_model(f"{first}:Net").model) == 4 * 3 + 3  # 15
    assert n_params(load_model(f"{second}:Net").model) == 8 * 3 + 3  # 27, not a stale 15
    assert sys.modules["mypkg.layers"].__file__ == str((second.parent / "layers.py").resolve())
    forget_user_modules()
    assert sys.path == path_before and "mypkg" not in sys.modules


def test_the_same_package_edited_between_loads_is_imported_again(tmp_path: Path) -> None:
    path = package(tmp_path, model_source("from .layers import Block"))
    assert n_params(load_model(f"{path}:Net").model) == 15  # Linear(4, 3)
    (path.parent / "layers.py").write_text(LAYERS.replace("WIDTH = 4", "WIDTH = 5"))
    assert n_params(load_model(f"{path}:Net").model) == 5 * 3 + 3  # 18


def test_plain_folders_with_the_same_sibling_name_each_get_their_own(tmp_path: Path) -> None:
    for width in (2, 7):
        folder = make_tree(tmp_path / f"w{width}", {
            "layers.py": LAYERS.replace("WIDTH = 4", f"WIDTH = {width}"),
            "model.py": model_source("from layers import Block"),
        })  # fmt: skip
        loaded = load_model(f"{folder / 'model.py'}:Net")
        assert n_params(loaded.model) == width * 3 + 3  # 9, then 24


LAZY_MODEL = """
from torch import nn

from .layers import Block


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        from .ops import double  # imported at the first call, after the load

        return double(self.block(x))
"""


def test_relative_import_inside_forward_works_after_the_load(tmp_path: Path) -> None:
    path = package(tmp_path, LAZY_MODEL)
    (path.parent / "ops.py").write_text("def double(x):\n    return 2 * x\n")
    model = load_model(f"{path}:Net").model
    x = torch.ones(1, 4)
    torch.testing.assert_close(model(x), 2 * model.block(x))


def test_missing_library_names_it_and_what_this_python_has(tmp_path: Path) -> None:
    path = package(tmp_path, model_source("from .layers import Block\nimport no_such_lib.ops"))
    with pytest.raises(LoadError) as info:
        load_model(f"{path}:Net")
    error = info.value
    assert error.location == "model.py:3"
    has = [f"torch {torch.__version__}"]  # then whichever model libraries are installed here
    has += [
        f"{name} {importlib.metadata.version(name)}"
        for name in ("torchvision", "timm", "transformers")
        if importlib.util.find_spec(name)
    ]
    assert error.message.startswith(
        f"model.py:3: No module named 'no_such_lib': this Python has {', '.join(has)}; "
        "not no_such_lib."
    )
    assert "import no_such_lib.ops" in error.message  # the user's line
    assert error.hint == "Install it here, or vendor it into the folder beside your model."


def test_missing_module_of_the_users_own_package_lists_what_it_has(tmp_path: Path) -> None:
    path = package(tmp_path, model_source("from mypkg.layer import Block"))  # layer, not layers
    with pytest.raises(LoadError) as info:
        load_model(f"{path}:Net")
    assert info.value.location == "model.py:2"
    assert "No module named 'mypkg.layer': your package mypkg has no module layer " in str(
        info.value
    )
    assert "(it has: layers, model)" in str(info.value)


def test_relative_import_in_a_plain_file_says_to_add_init(tmp_path: Path) -> None:
    make_tree(
        tmp_path, {"layers.py": LAYERS, "model.py": model_source("from .layers import Block")}
    )
    with pytest.raises(LoadError) as info:
        load_model(f"{tmp_path / 'model.py'}:Net")
    assert info.value.location == "model.py:2"
    assert "attempted relative import with no known parent package" in info.value.message
    assert "add an empty __init__.py to its folder" in str(info.value.hint)


def test_importing_its_own_folder_without_init_says_to_add_one(tmp_path: Path) -> None:
    files = {
        "mypkg/layers.py": LAYERS,
        "mypkg/model.py": model_source("from mypkg.layers import Block"),
    }
    make_tree(tmp_path, files)  # no mypkg/__init__.py: model.py is a plain file
    with pytest.raises(LoadError) as info:
        load_model(f"{tmp_path / 'mypkg' / 'model.py'}:Net")
    assert info.value.location == "model.py:2"
    assert "raised ModuleNotFoundError: No module named 'mypkg'" in info.value.message
    assert "mypkg/ holds your file but is not a package: add an empty __init__.py" in str(
        info.value.hint
    )


def test_syntax_error_in_a_package_module_names_that_file(tmp_path: Path) -> None:
    path = package(tmp_path, model_source("from .layers import Block"), layers="def f(:\n")
    with pytest.raises(LoadError) as info:
        load_model(f"{path}:Net")
    assert info.value.location == "layers.py:1"
    assert "syntax error in layers.py" in str(info.value)


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
