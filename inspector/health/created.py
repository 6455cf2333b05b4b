"""Parameters and modules created while forward runs: new on every call, so never trained
and never saved. Recorded by torch's global registration hooks (a module built in forward
registers its parameters) and by watching nn.Parameter being made."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from unittest import mock

from torch import nn

from inspector.health.locate import user_location

__all__ = ["Created", "creations"]


@dataclass
class Created:
    what: str  # "Linear" (a module that registered parameters), or "Parameter"
    location: str | None  # "file.py:LINE" in the user's forward
    source_line: str | None = None


@contextmanager
def creations(user_files: Sequence[str]) -> Iterator[list[Created]]:
    """Inside the block, every parameter made or registered, one entry per user line
    (a module's own parameters count once, under the module's type)."""
    found: dict[str | None, Created] = {}

    def note(what: str) -> None:
        where = user_location(list(user_files), skip=3)
        location, line = where if where else (None, None)
        known = found.get(location)
        if known is None or known.what == "Parameter":
            found[location] = Created(what, location, line)

    original = nn.Parameter.__new__

    def new_parameter(cls: type, data: object = None, requires_grad: bool = True) -> nn.Parameter:
        note("Parameter")
        return original(cls, data, requires_grad)

    def registered(module: nn.Module, name: str, value: object) -> None:
        if value is not None:
            note(type(module).__name__)

    hook = nn.modules.module.register_module_parameter_registration_hook(registered)
    listed: list[Created] = []
    try:
        with mock.patch.object(nn.Parameter, "__new__", new_parameter):
            yield listed
    finally:
        hook.remove()
        listed.extend(found.values())
