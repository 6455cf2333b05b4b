"""What a report was computed with (`meta.versions`): a regression that comes with an
upgrade is then seen as one (inspector.compare.setup_drift), not blamed on the code."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import re
from pathlib import Path

import torch

from inspector import __version__

__all__ = ["versions"]

_DRIVER = re.compile(r"Kernel Module\s+([0-9][0-9.]*)")


def versions(device: str) -> dict[str, str | None]:
    """torch, python, inspector, cuda and cudnn (None off CUDA), transformers (None when
    not installed), and on CUDA the GPU's name and the NVIDIA driver's version."""
    on_cuda = device == "cuda" and torch.cuda.is_available()
    found: dict[str, str | None] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "inspector": __version__,
        "cuda": torch.version.cuda if on_cuda else None,
        "cudnn": _cudnn() if on_cuda else None,
        "transformers": _installed("transformers"),
    }
    if on_cuda:
        found["gpu_name"] = torch.cuda.get_device_name()
        found["gpu_driver"] = _driver()
    return found


def _cudnn() -> str | None:
    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return str(version) if version is not None else None


def _installed(package: str) -> str | None:
    """The installed version, without importing the package (transformers takes seconds)."""
    if importlib.util.find_spec(package) is None:
        return None
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver() -> str | None:
    """The NVIDIA kernel driver's version (torch only knows the CUDA API level)."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    found = _DRIVER.search(text)
    return found.group(1) if found else None
