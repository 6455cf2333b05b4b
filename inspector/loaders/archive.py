"""Load a saved model: a `torch.export` archive (`.pt2`) or a TorchScript file.

Both are zip files; which one it is comes from its contents, not its name. A plain
`torch.save` of a whole module (a pickle) is refused: loading it runs arbitrary code.

Loading a `.pt2` unpickles and evaluates parts of the archive (`torch.export.load` is
not safe on untrusted files): the service only calls this inside its sandboxed child.
"""

from __future__ import annotations

import hashlib
import os
import warnings
import zipfile

import torch

from inspector.context import LoadedModel
from inspector.errors import LoadError
from inspector.loaders.factories import TensorsFactory

__all__ = ["archive_kind", "load_archive"]

_SAVE_HINT = (
    "Save the model with torch.export (`torch.export.save(torch.export.export(model, args), "
    "'model.pt2')`) or give a Python file: model.py:make_model."
)


def archive_kind(path: str) -> str:
    """ "pt2", "torchscript", "pickle" (a torch.save file) or "unknown", from the contents."""
    if not zipfile.is_zipfile(path):
        return "pickle" if _looks_like_pickle(path) else "unknown"
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    if any(n.endswith("/archive_format") or n == "archive_format" for n in names):
        return "pt2"
    if any("/code/" in n for n in names) and any(n.endswith("constants.pkl") for n in names):
        return "torchscript"
    if any(n.endswith("data.pkl") for n in names):
        return "pickle"
    return "unknown"


def _looks_like_pickle(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(2)
    return len(head) == 2 and head[0] == 0x80  # pickle protocol 2+ starts with PROTO


def load_archive(path: str, *, device: str = "cpu") -> LoadedModel:
    """Load a .pt2 or TorchScript file (real weights: neither can be built fake)."""
    name = os.path.basename(path)
    kind = archive_kind(path)
    if kind == "pickle":
        raise LoadError(
            f"{name} is a pickled object (torch.save), which runs code when loaded: refused.",
            hint=_SAVE_HINT,
        )
    if kind == "unknown":
        raise LoadError(
            f"{name} is neither a torch.export archive (.pt2) nor a TorchScript file.",
            hint=_SAVE_HINT,
        )
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()  # noqa: SIM115
    loaded = _load_pt2(path, name) if kind == "pt2" else _load_torchscript(path, name, device)
    loaded.sha256 = sha
    loaded.model = loaded.model.to(device)
    return loaded


def _load_pt2(path: str, name: str) -> LoadedModel:
    try:
        program = torch.export.load(path)
    except Exception as exc:
        raise LoadError(
            f"cannot load {name} as a torch.export archive: {type(exc).__name__}: {exc}",
            hint="Save it with torch.export.save() from the same or an older torch version.",
        ) from None
    loaded = LoadedModel(
        model=program.module(), source_kind="pt2", source_name=name, exported=program
    )
    if program.example_inputs is not None:
        args, kwargs = program.example_inputs
        loaded.inputs = TensorsFactory(args, kwargs, spec={"from": f"{name} example inputs"})
    return loaded


def _load_torchscript(path: str, name: str, device: str) -> LoadedModel:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "torch.jit.load is deprecated"
            warnings.simplefilter("ignore", DeprecationWarning)
            model = torch.jit.load(path, map_location=device)
    except Exception as exc:
        raise LoadError(
            f"cannot load {name} as TorchScript: {type(exc).__name__}: {exc}", hint=_SAVE_HINT
        ) from None
    return LoadedModel(model=model, source_kind="torchscript", source_name=name)
