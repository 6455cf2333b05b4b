"""Model Graph Inspector: shapes, memory and gradient health of PyTorch models.

Importing the package (and `inspector.report`, `inspector.units`) does not import torch:
the web process reads reports without it. `Options` and `inspect_model` load torch lazily.
"""

from __future__ import annotations

from typing import Any

from inspector.compat.torchvision_ops import install_import_hook
from inspector.report import SCHEMA_VERSION, Report

# torchvision built for another torch would fail to import (and take transformers with it).
install_import_hook()

__version__ = "0.1.0"
__all__ = ["Options", "Report", "SCHEMA_VERSION", "inspect_model", "__version__"]


def inspect_model(*args: Any, **kwargs: Any) -> Report:
    """See `inspector.analyze.inspect_model`."""
    from inspector.analyze import inspect_model as _inspect

    return _inspect(*args, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "Options":
        from inspector.context import Options

        return Options
    raise AttributeError(f"module 'inspector' has no attribute {name!r}")
