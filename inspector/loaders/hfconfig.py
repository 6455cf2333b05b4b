"""Hugging Face `config.json` uploads: the architecture built from its config, no weights.

The model is built inside the caller's FakeTensorMode, so a 70B-parameter config costs
no weight memory. Nothing is downloaded: `transformers` builds from the config alone.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from inspector.context import LoadedModel
from inspector.errors import LoadError
from inspector.loaders.fakebuild import (
    building_under,
    default_dtype,
    empty_weights,
    fake_weights,
    needs_values,
)

__all__ = ["load_config", "build_from_config", "default_spec"]

# Never reach for a hub, whatever the environment says.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def load_config(path: str, *, fake_mode: Any = None, device: str = "cpu") -> LoadedModel:
    """Build the model a `config.json` describes (inside `fake_mode` when given)."""
    file = Path(path)
    if not file.is_file():
        raise LoadError(f"config file not found: {path}")
    raw = file.read_bytes()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise LoadError(
            f"{file.name} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    loaded = build_from_config(data, name=file.name, fake_mode=fake_mode, device=device)
    loaded.sha256 = hashlib.sha256(raw).hexdigest()
    return loaded


def build_from_config(
    data: dict[str, Any], *, name: str, fake_mode: Any = None, device: str = "cpu"
) -> LoadedModel:
    """Build from a config dict with a `model_type` (and ideally `architectures`)."""
    config = _config_from_dict(data, name)
    model_class = _model_class(config, data, name)
    model = _build(model_class, config, name, fake_mode, device)
    from inspector.inputspec import parse_input  # noqa: PLC0415 - avoids an import cycle

    loaded = LoadedModel(model=model, source_kind="hf-config", source_name=name)
    loaded.entrypoint = model_class.__name__
    loaded.inputs = parse_input(json.dumps(default_spec(config, model)), loaded)
    return loaded


def _build(model_class: Any, config: Any, name: str, fake_mode: Any, device: str) -> Any:
    """The model, built under `fake_mode` when given; a constructor that reads tensor
    values (ConvNeXt's drop-path linspace) is built again with its weights on the meta
    device, then faked."""
    dtype = _param_dtype(config)
    try:
        with building_under(fake_mode, device, dtype):
            return model_class(config)
    except Exception as exc:  # the config's values, not our code, are at fault
        if fake_mode is None or not needs_values(exc):
            raise LoadError(
                f"{name}: transformers could not build {model_class.__name__} from this "
                f"config: {type(exc).__name__}: {exc}"
            ) from None
    with empty_weights(device), default_dtype(dtype):
        model = model_class(config)
    return fake_weights(model, fake_mode, device)


def _param_dtype(config: Any) -> Any:
    """The dtype the config says its weights are in (`torch_dtype`, `dtype` in newer
    transformers); float32 when it names none."""
    import torch

    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, str):
        value = getattr(torch, value.removeprefix("torch."), None)
    return value if isinstance(value, torch.dtype) and value.is_floating_point else None


def _config_from_dict(data: dict[str, Any], name: str) -> Any:
    import transformers

    if not isinstance(data, dict) or "model_type" not in data:
        raise LoadError(
            f"{name} has no 'model_type': a Hugging Face config.json names its architecture "
            'family, e.g. {"model_type": "llama", ...}.'
        )
    values = {k: v for k, v in data.items() if k not in ("model_type", "transformers_version")}
    try:
        return transformers.AutoConfig.for_model(data["model_type"], **values)
    except (ValueError, KeyError) as exc:
        raise LoadError(
            f"{name}: model_type {data['model_type']!r} is not known to transformers "
            f"{transformers.__version__} ({exc})"
        ) from None


def _model_class(config: Any, data: dict[str, Any], name: str) -> Any:
    import transformers

    for arch in data.get("architectures") or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    # No (known) architecture named: the model family's causal LM head, else its base model.
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        mapping = auto._model_mapping
        if type(config) in mapping:
            return mapping[type(config)]
    raise LoadError(
        f"{name}: no model class for model_type {data['model_type']!r}; add an "
        '"architectures" list, e.g. ["LlamaForCausalLM"].'
    )


def default_spec(config: Any, model: Any) -> dict[str, Any]:
    """The input a model of this config takes, with named dims B (batch) and S (sequence)."""
    main_input = getattr(model, "main_input_name", "input_ids")
    if main_input == "pixel_values":
        channels = getattr(config, "num_channels", 3)
        size = getattr(config, "image_size", 224)
        return {"pixel_values": {"shape": ["B", channels, size, size]}, "dims": {"B": 1}}
    max_positions = getattr(config, "max_position_embeddings", None) or getattr(
        config, "n_positions", 1024
    )
    seq = min(int(max_positions), 4096)
    vocab = int(getattr(config, "vocab_size", 32000))
    return {
        main_input: {"shape": ["B", "S"], "dtype": "int64", "high": vocab},
        "dims": {"B": 1, "S": seq},
    }
