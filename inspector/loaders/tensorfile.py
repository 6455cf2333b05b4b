"""Inputs from a tensor file: `.pt`/`.pth` read with `weights_only=True`, or `.safetensors`.

`weights_only` refuses any pickle that would build objects other than tensors and plain
containers, so a file crafted to run code is rejected before it runs.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from typing import Any

import torch
from torch import nn

from inspector.errors import InputSpecError
from inspector.loaders.factories import TensorsFactory, split_example

__all__ = ["TENSOR_SUFFIXES", "load_tensor_file"]

TENSOR_SUFFIXES = (".pt", ".pth", ".safetensors")


def load_tensor_file(path: str, model: nn.Module | None) -> TensorsFactory:
    """A factory that returns copies of the tensors stored in `path`."""
    name = os.path.basename(path)
    if not os.path.isfile(path):
        raise InputSpecError(f"input file not found: {path}")
    value = _read_safetensors(path) if path.endswith(".safetensors") else _read_pt(path)
    try:
        args, kwargs = split_example(value, model)
    except TypeError as exc:
        raise InputSpecError(
            f"{name} holds {exc}.",
            hint="Save a tensor, a tuple/list of tensors or a dict of tensors.",
        ) from None
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()  # noqa: SIM115
    return TensorsFactory(args, kwargs, spec={"file": name, "sha256": sha})


def _read_pt(path: str) -> Any:
    name = os.path.basename(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InputSpecError(
            f"{name} was refused: it holds objects other than tensors, and loading it "
            f"could run code ({first}).",
            hint="Save only tensors: torch.save(tensor_or_tuple_or_dict, 'inputs.pt'), "
            "or use safetensors.",
        ) from None
    except Exception as exc:
        raise InputSpecError(
            f"cannot read {name} as a torch tensor file: {type(exc).__name__}: {exc}"
        ) from None


def _read_safetensors(path: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        name = os.path.basename(path)
        raise InputSpecError(f"cannot read {name} as safetensors: {exc}") from None
