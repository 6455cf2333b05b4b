"""The view model of the upload form: the presets and the analysis options, with their
choices and defaults from `inspector.schema`, the same ones the API checks."""

from __future__ import annotations

from typing import Any

from inspector.schema.options import (
    AUTOCAST_DTYPES,
    COMPILE_LEVELS,
    DEFAULT_COMPILE,
    DEFAULT_DTYPE,
    DEFAULT_EXPORT,
    DEFAULT_OPTIMIZER,
    DEFAULT_SERVING,
    DEVICES,
    EXPORT_LEVELS,
    OPTIMIZERS,
    SERVING_CHOICES,
)
from inspector.schema.presets import PRESETS, preset_names

__all__ = ["presets", "option_selects"]


def presets() -> list[Any]:
    return [PRESETS[name] for name in preset_names()]


def option_selects(default_device: str) -> list[dict[str, Any]]:
    """One select per choice option: form field name, label, choices, default.

    The device's default is the server's (`Settings.device`): an untouched form asks for
    what an API upload without `device` gets."""
    return [
        _select("optimizer", "Optimizer", OPTIMIZERS, DEFAULT_OPTIMIZER),
        _select("dtype", "Autocast dtype", AUTOCAST_DTYPES, DEFAULT_DTYPE),
        _select("device", "Device", DEVICES, default_device),
        _select("export", "Export check", EXPORT_LEVELS, DEFAULT_EXPORT),
        _select("compile", "torch.compile check", COMPILE_LEVELS, DEFAULT_COMPILE),
        _select("serving", "Serving memory", SERVING_CHOICES, DEFAULT_SERVING),
    ]


def _select(name: str, label: str, choices: tuple[str, ...], default: str) -> dict[str, Any]:
    return {"name": name, "label": label, "choices": choices, "default": default}
