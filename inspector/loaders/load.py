"""Turn a model source into a `LoadedModel`: the dispatcher over source kinds.

Sources: `file.py:entry` (a class or factory in a Python file), a `torch.export`
archive (`.pt2`), a TorchScript file, `preset:NAME`, or a Hugging Face `config.json`.
Every source is untrusted: the service only calls this inside its sandboxed child.
"""

from __future__ import annotations

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
        from inspector.loaders.presets import load_preset  # transformers, only when asked

        return load_preset(source.removeprefix("preset:"), fake_mode=fake_mode, device=device)
    path, entry = split_source(source)
    lower = path.lower()
    if lower.endswith(".py"):
        return load_python(path, entry, fake_mode=fake_mode, device=device)
    _require_file(path)
    if lower.endswith(".json"):
        from inspector.loaders.hfconfig import load_config  # transformers, only when asked

        return load_config(path, fake_mode=fake_mode, device=device)
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
