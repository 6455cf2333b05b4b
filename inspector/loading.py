"""Turn a model source into a `LoadedModel`: the dispatcher over source kinds.

Sources: `file.py:entry` (a class or factory in a Python file), a `torch.export`
archive (`.pt2`), a TorchScript file, `preset:NAME`, or a Hugging Face `config.json`.
Every source is untrusted: the service only calls this inside its sandboxed child.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from inspector.context import LoadedModel
from inspector.errors import LoadError
from inspector.loaders.archive import load_archive
from inspector.loaders.pyfile import load_python, split_source

__all__ = ["load_model", "LoadedModel"]

# Refused outright: a whole pickled object runs arbitrary code when loaded.
_PICKLE_SUFFIXES = (".pkl", ".pickle")
_ARCHIVE_SUFFIXES = (".pt2", ".pt", ".pth", ".ts", ".jit", ".torchscript", ".zip")


def load_model(source: str, *, fake_mode: Any = None, device: str = "cpu") -> LoadedModel:
    """Load `source`; with `fake_mode`, build the model's parameters as fake tensors.

    Raises `LoadError` with what was wrong, where, and what to do.
    """
    if source.startswith("preset:"):
        loader = _optional_loader("inspector.presets", "load_preset", "preset:NAME")
        return loader(source.removeprefix("preset:"), fake_mode=fake_mode, device=device)
    path, entry = split_source(source)
    lower = path.lower()
    if lower.endswith(".py"):
        return load_python(path, entry, fake_mode=fake_mode, device=device)
    _require_file(path)
    if lower.endswith(".json"):
        loader = _optional_loader("inspector.hfconfig", "load_config", "config.json")
        return loader(path, fake_mode=fake_mode, device=device)
    if lower.endswith(_PICKLE_SUFFIXES):
        raise LoadError(
            f"{os.path.basename(path)} is a pickle file: whole pickled objects run code when "
            "loaded, so they are refused.",
            hint="Save the model with torch.export (`torch.export.save(ep, 'model.pt2')`) "
            "or give a Python file: model.py:make_model.",
        )
    if lower.endswith(_ARCHIVE_SUFFIXES):
        return load_archive(path, device=device)
    raise LoadError(
        f"don't know how to load {source!r}.",
        hint="Give file.py:entry, a .pt2 (torch.export) or TorchScript file, preset:NAME, "
        "or a Hugging Face config.json.",
    )


def _require_file(path: str) -> None:
    if not os.path.isfile(path):
        raise LoadError(f"model file not found: {path}", hint="Check the path and try again.")


def _optional_loader(module: str, func: str, kind: str) -> Any:
    """The loader of a source kind implemented in another module, when it exists."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise LoadError(
            f"model sources of the kind {kind} are not supported by this version.",
            hint="Give file.py:entry, a .pt2 (torch.export) or a TorchScript file.",
        ) from None
    return getattr(mod, func)
