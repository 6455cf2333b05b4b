"""Model Graph Inspector: shapes, memory and gradient health of PyTorch models."""

from __future__ import annotations

__version__ = "0.1.0"

from inspector.context import Options  # noqa: E402
from inspector.report import SCHEMA_VERSION, Report  # noqa: E402


def inspect_model(*args, **kwargs) -> Report:  # noqa: ANN002, ANN003 - re-exported below
    """See `inspector.analyze.inspect_model`."""
    from inspector.analyze import inspect_model as _inspect

    return _inspect(*args, **kwargs)


__all__ = ["Options", "Report", "SCHEMA_VERSION", "inspect_model", "__version__"]
