"""Files whose pickles run code when loaded: a `.pt` tensor file and a `.pt2` archive."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import torch


class _RunsCode:
    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self):  # noqa: ANN204 - what makes unpickling call exec(code)
        return (exec, (self.code,))


def _torch_save(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def evil_pt(marker: Path) -> bytes:
    """A .pt 'tensor file' whose unpickling writes `marker` (refused by weights_only)."""
    return _torch_save({"x": _RunsCode(f"open({str(marker)!r}, 'w').write('pwned')")})


def evil_pt2(marker: Path) -> bytes:
    """A torch.export archive whose weight is a pickle that runs code in torch.export.load:
    it says where it ran, and tries to write `marker` on the host."""
    code = (
        "import os\n"
        "try:\n"
        f"    open({str(marker)!r}, 'w').write('pwned'); host = 'host write ok'\n"
        "except OSError as e:\n"
        "    host = type(e).__name__\n"
        "raise RuntimeError(f'payload ran as uid {os.getuid()}, {host}')\n"
    )
    model = torch.nn.Linear(8, 4)
    program = torch.export.export(model, (torch.randn(2, 8),))
    clean = io.BytesIO()
    torch.export.save(program, clean)
    return _poison(clean.getvalue(), _torch_save(_RunsCode(code)))


def _poison(archive: bytes, payload: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("model_weights_config.json"):
                config = json.loads(data)
                config["config"]["bias"].update(use_pickle=True, path_name="evil")
                data = json.dumps(config).encode()
                dst.writestr(info.filename.replace("model_weights_config.json", "evil"), payload)
            dst.writestr(info, data)
    return out.getvalue()
