"""Input checks before queueing: the input spec (the library's grammar) and tensor files.

The web process never imports torch: the grammar is torch-free; what needs the model
(forward's parameters, a preset's own dims) is checked in the job child."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from inspector.errors import InputSpecError
from inspector.schema.inputspec import EXAMPLE, parse_spec_text
from server.api.errors import ApiError

__all__ = ["check_input_spec", "input_file_kind", "check_input_file"]

INPUT_FILE_KINDS = {".pt": "pt", ".pth": "pt", ".safetensors": "safetensors"}
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


def check_input_spec(text: str) -> None:
    """Refuse, with the library's own message, every spec the library would refuse before
    seeing the model: the same grammar (`inspector.schema.inputspec`) runs here."""
    try:
        parse_spec_text(text)
    except InputSpecError as exc:
        details = {"example": EXAMPLE, **({"hint": exc.hint} if exc.hint else {})}
        raise ApiError(422, "invalid", f"input spec: {exc.message}", details) from None


def input_file_kind(filename: str) -> str:
    kind = INPUT_FILE_KINDS.get(Path(filename).suffix.lower())
    if kind is None:
        raise ApiError(
            422,
            "invalid",
            f"input file {filename!r}: use a .pt/.pth (tensors) or .safetensors file",
        )
    return kind


def check_input_file(path: Path, kind: str, filename: str) -> None:
    """A cheap sanity check; loading (weights_only / safetensors) happens in the sandbox."""
    size = path.stat().st_size
    if size == 0:
        raise ApiError(422, "invalid", f"input file {filename!r} is empty")
    if kind == "safetensors":
        _check_safetensors_header(path, size, filename)


def _check_safetensors_header(path: Path, size: int, filename: str) -> None:
    # Layout: 8-byte little-endian header length, then that many bytes of JSON.
    with open(path, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        ok = 0 < length <= min(size - 8, MAX_SAFETENSORS_HEADER)
        try:
            ok = ok and isinstance(json.loads(f.read(length)), dict)
        except ValueError:
            ok = False
    if not ok:
        raise ApiError(422, "invalid", f"input file {filename!r} is not a safetensors file")
