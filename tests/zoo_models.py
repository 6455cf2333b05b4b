"""The zoo: standard models people bring, built without any download, at small CPU sizes.

Each entry is a builder and an `inputs()` that returns `(args, kwargs)` (called again
for every run, so that under fake tensors its tensors are fake), plus an optional loss.
Shared by `tests/test_zoo.py` and `bench/zoo.py`; it does not import `inspector`, except
that the caller imports it before torchvision (see inspector/compat/torchvision_ops.py).

`entry_file(name, folder)` writes the small model file a user would write
(`model()`, `example_inputs()`, `loss_fn()`), so the zoo goes through the real loader.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zoo_hf import HF_MODELS
from zoo_small import SMALL_MODELS
from zoo_vision import FIRST_TV, VISION_MODELS

__all__ = ["ZooModel", "ZOO", "entry_file", "names"]


@dataclass(frozen=True)
class ZooModel:
    name: str
    kind: str  # classification, segmentation, detection, video, flow, timm, hf, classic
    build: Callable[[], Any]
    inputs: Callable[[], tuple[tuple, dict]]
    loss_fn: Callable[[Any, Any], Any] | None = None  # loss_fn(output, inputs) as users write it
    heavy: bool = False  # large or slow on 2 CPU cores: only in `bench/zoo.py --all`
    draws: int = 1  # seeds the truth's step takes the largest of (a step that varies)
    note: str = ""


def _catalogue() -> dict[str, ZooModel]:
    out: dict[str, ZooModel] = {}
    for spec in (*SMALL_MODELS, *VISION_MODELS, *HF_MODELS):
        model = ZooModel(**spec)
        if model.name in out:  # two families spelling one name: a catalogue bug
            raise ValueError(f"duplicate zoo name {model.name}")
        out[model.name] = model
    return out


ZOO: dict[str, ZooModel] = _catalogue()


def names(kind: str | None = None, heavy: bool = True) -> list[str]:
    """Zoo names, round-robin over the kinds (each family's first classification model
    before the other sizes), so that a partial sweep already covers every kind."""
    chosen = [
        n for n, m in ZOO.items() if (kind is None or m.kind == kind) and (heavy or not m.heavy)
    ]
    by_kind: dict[str, list[str]] = {}
    for n in sorted(chosen, key=lambda n: ZOO[n].kind == "classification" and n not in FIRST_TV):
        by_kind.setdefault(ZOO[n].kind, []).append(n)
    queues = list(by_kind.values())
    out = []
    while any(queues):
        out += [q.pop(0) for q in queues if q]
    return out


_ENTRY = '''"""Zoo model {name} ({kind}), as a user's model file."""
import sys

sys.path.insert(0, {tests!r})
import inspector  # noqa: F401 - before torchvision: its C++ ops are replaced
import zoo_models

_Z = zoo_models.ZOO[{name!r}]


def model():
    return _Z.build()


def example_inputs():
    return _Z.inputs()
'''

_LOSS = """

def loss_fn(output, inputs):
    return _Z.loss_fn(output, inputs)
"""


def entry_file(name: str, folder: str) -> str:
    """Write `folder/zoo_<name>.py` and return its `file.py:entry` source."""
    zoo = ZOO[name]
    text = _ENTRY.format(name=name, kind=zoo.kind, tests=os.path.dirname(__file__))
    if zoo.loss_fn is not None:
        text += _LOSS
    path = os.path.join(folder, f"zoo_{name.replace('-', '_')}.py")
    with open(path, "w") as f:
        f.write(text)
    return f"{path}:model"
