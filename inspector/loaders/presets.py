"""Built-in presets: well-known architectures by name, each with a default input.

`inspector inspect preset:llama-3-70b --input '{"dims": {"B": 1, "S": 4096}}'`
Transformer presets are Hugging Face configs written out here (no download); ResNet-50 is
the project's own. Every preset is analysed on fake tensors: no weights are allocated.
"""

from __future__ import annotations

import json
from typing import Any

from inspector.context import LoadedModel
from inspector.errors import LoadError
from inspector.loaders.fakebuild import building_under
from inspector.schema.presets import PRESETS, Preset, preset_names

__all__ = ["PRESETS", "Preset", "load_preset", "preset_names"]


def load_preset(name: str, *, fake_mode: Any = None, device: str = "cpu") -> LoadedModel:
    """Build preset `name` (inside `fake_mode` when given) with its default input."""
    preset = PRESETS.get(name)
    if preset is None:
        raise LoadError(f"unknown preset {name!r}. Presets: {', '.join(preset_names())}.")
    if preset.config:
        from inspector.loaders.hfconfig import build_from_config

        loaded = build_from_config(
            preset.config, name=f"preset:{name}", fake_mode=fake_mode, device=device
        )
    else:
        loaded = _own_model(preset, fake_mode, device)
    loaded.source_kind = "preset"
    loaded.entrypoint = name
    if preset.spec is not None:
        from inspector.inputspec import parse_input

        loaded.inputs = parse_input(json.dumps(preset.spec), loaded)
    return loaded


def _own_model(preset: Preset, fake_mode: Any, device: str) -> LoadedModel:
    from inspector.loaders.zoo.resnet import ResNet50

    with building_under(fake_mode, device):
        model = ResNet50()
    return LoadedModel(model=model, source_kind="preset", source_name=f"preset:{preset.name}")
