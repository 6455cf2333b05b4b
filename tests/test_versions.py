"""meta.versions: what a report was computed with, read from the running stack."""

from __future__ import annotations

import importlib.metadata
import platform

import pytest
import torch

from inspector import __version__
from inspector.analyze import _meta
from inspector.context import Options
from inspector.versions import versions


def test_versions_on_cpu() -> None:
    found = versions("cpu")
    assert found == {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "inspector": __version__,
        "cuda": None,  # a CPU run has no CUDA, whatever the build
        "cudnn": None,
        "transformers": importlib.metadata.version("transformers"),
    }


def test_transformers_is_none_when_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name)
    )
    assert versions("cpu")["transformers"] is None


def test_every_report_records_its_versions() -> None:
    meta = _meta("model.py:Net", None, Options(device="cpu"))
    assert meta.versions["torch"] == meta.torch_version == torch.__version__
    assert meta.versions["cuda"] is None and "gpu_name" not in meta.versions


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_versions_on_cuda() -> None:
    found = versions("cuda")
    assert found["cuda"] == torch.version.cuda and found["gpu_name"]
    assert found["cudnn"] == str(torch.backends.cudnn.version())
