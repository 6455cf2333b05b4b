"""The model libraries a model file most often imports, and which of them are installed.

Torch-free: the versions come from package metadata, so the web process and the worker
can say what a job will find without importing anything."""

from __future__ import annotations

import importlib.metadata

__all__ = ["MODEL_LIBRARIES", "installed_versions"]

MODEL_LIBRARIES = ("torchvision", "timm", "transformers")


def installed_versions() -> dict[str, str]:
    """`{"torch": "2.13.0+cpu", "timm": "1.0.31", ...}` for torch and the MODEL_LIBRARIES
    installed here (a missing one is left out)."""
    versions = {}
    for name in ("torch", *MODEL_LIBRARIES):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions
