"""A capture leaves the user's model as it found it.

A forward may store what it computes on its modules: HF Swin's
`set_shift_and_window_size` sets `self.window_size = min(input_resolution)`, so while fx
traces it the module keeps a traced value (a Proxy) that every later run then trips
over (`floordiv_6 has no value`), which used to be reported as the model failing to
train. Every module's attributes, and its parameter, buffer and child tables, are put
back as they were.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

__all__ = ["attributes_kept"]

_TABLES = ("_parameters", "_buffers", "_modules")


@contextmanager
def attributes_kept(model: nn.Module) -> Iterator[None]:
    """Restore every module's own attributes (not tensor contents) on the way out."""
    saved = [(m, dict(vars(m)), _tables(m)) for m in model.modules()]
    try:
        yield
    finally:
        for module, attrs, tables in saved:
            _restore(module, attrs, tables)


def _tables(module: nn.Module) -> dict[str, dict[str, Any]]:
    return {name: dict(getattr(module, name, None) or {}) for name in _TABLES}


def _restore(module: nn.Module, attrs: dict[str, Any], tables: dict[str, dict]) -> None:
    own = vars(module)
    for name in set(own) - set(attrs):
        del own[name]
    own.update(attrs)
    for name, contents in tables.items():
        table = own.get(name)
        if isinstance(table, dict):  # the same dict object, its entries put back
            table.clear()
            table.update(contents)
