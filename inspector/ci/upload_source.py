"""What `inspector submit` uploads: the model file (a directory zipped here) and its input.

Torch-free: only files are read; nothing of the user's code is imported or run here.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from inspector.errors import InputSpecError, LoadError

__all__ = ["ModelUpload", "InputUpload", "resolve_model", "resolve_input", "zip_directory"]

_SKIP_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".venv", "venv", "node_modules", ".tox"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
_TENSOR_SUFFIXES = (".pt", ".pth", ".safetensors")
_EXAMPLES = "file.py:Net, pkg_dir:pkg/model.py:Net, archive.zip:pkg/model.py:Net or model.pt2"


@dataclass(frozen=True)
class ModelUpload:
    filename: str
    data: bytes
    entrypoint: str | None  # None for a .pt2 archive


@dataclass(frozen=True)
class InputUpload:
    spec: str | None = None  # input spec JSON text
    filename: str | None = None  # or a tensor file
    data: bytes | None = None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise LoadError(f"cannot read {path}: {exc.strerror or exc}") from None


def resolve_model(model: str) -> ModelUpload:
    """`file.py:Entry`, `DIR:pkg/model.py:Entry` (zipped here), `x.zip:pkg/model.py:Entry`,
    or `model.pt2`."""
    path = Path(model)
    if path.suffix.lower() == ".pt2":
        if not path.is_file():
            raise LoadError(f"{model}: no such file.", hint=f"Examples: {_EXAMPLES}")
        return ModelUpload(path.name, _read(path), None)
    source, sep, entry = model.partition(":")
    while sep and not Path(source).exists() and ":" in entry:  # Windows-style `C:...` paths
        head, sep, entry = entry.partition(":")
        source = f"{source}:{head}"
    source_path = Path(source)
    if not sep or not entry.strip():
        raise LoadError(f"{model!r}: name the entrypoint too.", hint=f"Examples: {_EXAMPLES}")
    if source_path.is_dir():
        return _directory(source_path, entry.strip())
    if not source_path.is_file():
        raise LoadError(f"{source}: no such file or directory.", hint=f"Examples: {_EXAMPLES}")
    suffix = source_path.suffix.lower()
    if suffix == ".py":
        return ModelUpload(source_path.name, _read(source_path), f"{source_path.name}:{entry}")
    if suffix == ".zip":
        return ModelUpload(source_path.name, _read(source_path), entry.strip())
    raise LoadError(f"{source}: not a .py, .zip, .pt2 file or a directory.", hint=_EXAMPLES)


def _directory(root: Path, entry: str) -> ModelUpload:
    """Zip `root` under its own name; `entry` may be relative to it or name it first.
    The job imports a file in a package folder (one with `__init__.py`) as part of it."""
    root = root.resolve()  # `.` has no name to zip under
    member, _, name = entry.rpartition(":")
    if not member or not name:
        raise LoadError(
            f"{root}:{entry}: write DIR:path/in/dir.py:Entry, e.g. {root.name}:model.py:Net"
        )
    inside = member if member.startswith(f"{root.name}/") else f"{root.name}/{member}"
    if not (root.parent / inside).is_file():
        raise LoadError(f"{member} is not a file in {root} (looked for {root.parent / inside}).")
    return ModelUpload(f"{root.name}.zip", zip_directory(root), f"{inside}:{name}")


def zip_directory(root: Path) -> bytes:
    """The directory's files under `root.name/`, without caches, VCS data and links."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
            for name in sorted(files):
                path = Path(folder) / name
                if path.is_symlink() or name.endswith(_SKIP_SUFFIXES):
                    continue
                archive.write(path, path.relative_to(root.parent).as_posix())
    return buffer.getvalue()


def resolve_input(value: str | None) -> InputUpload:
    """JSON text, a `.json` file holding a spec, or a tensor file (.pt, .safetensors)."""
    if value is None or not value.strip():
        return InputUpload()
    text = value.strip()
    if text.startswith(("{", "[")):
        return InputUpload(spec=_checked_json(text, "--input"))
    path = Path(text)
    if path.suffix.lower() == ".json":
        return InputUpload(spec=_checked_json(_read(path).decode("utf-8", "replace"), str(path)))
    if path.suffix.lower() in _TENSOR_SUFFIXES:
        return InputUpload(filename=path.name, data=_read(path))
    raise InputSpecError(
        f"--input {value!r}: not JSON, a .json file or a tensor file (.pt, .safetensors).",
        hint='Example: --input \'{"x": {"shape": ["B", 8]}, "dims": {"B": 2}}\'',
    )


def _checked_json(text: str, source: str) -> str:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputSpecError(
            f"{source}:{exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})."
        ) from None
    return text
