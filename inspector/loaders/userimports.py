"""Where a user's model file is imported from, and keeping their modules apart from ours.

A file inside a package (its folder, and maybe folders above, hold `__init__.py`) is
imported by its dotted name, `mypkg.model`, with the package root's parent first on
`sys.path`: `from mypkg.layers import X` and `from .layers import X` both work, as with
`python -m mypkg.model` in the user's checkout (a `src/` layout too: `src/` is that
parent). A plain file is run as a fresh module with its folder on `sys.path`, so the
modules beside it import.

The user's modules keep their real names in `sys.modules` (`mypkg`, `utils`). They stay
there after the load, because forward, `example_inputs()` and `inspect.getfile` still
need them; the next load drops them with the `sys.path` entries it added, so a second
upload never sees the first one's modules. A module that answers to one of the user's
names and is not the runtime's own (the standard library, the installed packages,
torch, inspector) is set aside for the load and put back at the next one: the user's
`models` package wins over a `models` imported before.
"""

from __future__ import annotations

import keyword
import os
import sys
import sysconfig
import types
from dataclasses import dataclass, field
from functools import lru_cache

from inspector.errors import LoadError

__all__ = ["ImportPlan", "plan_import", "prepare_imports", "forget_user_modules"]

# `__main__` may be a script in the user's folder: still never theirs to drop.
_RUNTIME_NAMES = frozenset({"inspector", "torch", "__main__", "__mp_main__"})
_FRESH_PREFIX = "_inspector_user_"  # plain files run under unique names: never stale


@dataclass(frozen=True)
class ImportPlan:
    """How to import one model file."""

    path: str  # the file, resolved
    module_name: str | None  # "mypkg.sub.model"; None for a plain file
    search_paths: tuple[str, ...]  # put first on sys.path, in this order
    package: str | None  # the top-level package ("mypkg"), None for a plain file


@dataclass
class _Previous:
    """What the last load changed, undone by the next one."""

    paths: list[str] = field(default_factory=list)
    set_aside: dict[str, types.ModuleType] = field(default_factory=dict)
    # Modules the process had imported itself before the load (a test module beside the
    # model file, a notebook's own): the next load leaves them alone.
    hosts: set[str] = field(default_factory=set)


_previous = _Previous()


def plan_import(path: str) -> ImportPlan:
    """The dotted name and import root of `path`: walk up while folders hold `__init__.py`."""
    path = os.path.realpath(path)
    folder = os.path.dirname(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    packages = _enclosing_packages(folder)
    if not packages or not (stem == "__init__" or _importable(stem)):
        return ImportPlan(path, None, (folder,), None)
    root_parent = folder
    for _ in packages:
        root_parent = os.path.dirname(root_parent)
    names = packages if stem == "__init__" else [*packages, stem]
    # The file's own folder after the root's parent: `from layers import X` inside a
    # package, which works when the user runs the file as a script, keeps working.
    return ImportPlan(path, ".".join(names), (root_parent, folder), packages[0])


def _enclosing_packages(folder: str) -> list[str]:
    """Package names from the outermost down to `folder`'s; [] when it is no package."""
    names: list[str] = []
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        name = os.path.basename(folder)
        if not _importable(name):  # `my-repo/__init__.py`: not a package Python can import
            break
        names.insert(0, name)
        folder = os.path.dirname(folder)
    return names


def _importable(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def prepare_imports(plan: ImportPlan) -> None:
    """Undo the previous load, set aside modules answering to the user's names, and put
    the plan's folders first on sys.path (until the next load)."""
    forget_user_modules()
    if plan.package is not None:
        _refuse_runtime_name(plan.package, plan.path)
    for name in _provided_names(plan.search_paths):
        _set_aside(name, plan.search_paths)
    for path in reversed(plan.search_paths):
        sys.path.insert(0, path)
    _previous.paths = list(plan.search_paths)
    _previous.hosts = set(sys.modules)


def forget_user_modules() -> None:
    """Drop the modules the previous load imported from the user's folders and its
    sys.path entries; put back what it set aside."""
    if _previous.paths:
        # only what the load added can be its: each location is a realpath, and resolving
        # all of sys.modules took 0.1 s of a ResNet-18 report's load (2,600 modules)
        added = [n for n in sys.modules if n not in _previous.hosts]
        for name in added:
            fresh = name.startswith(_FRESH_PREFIX)
            module = sys.modules[name]
            if not fresh and _inside(_location(module), _previous.paths) and not _is_runtime(name):
                del sys.modules[name]
    for path in _previous.paths:
        if path in sys.path:
            sys.path.remove(path)
    for name, module in _previous.set_aside.items():
        sys.modules.setdefault(name, module)
    _previous.paths, _previous.set_aside, _previous.hosts = [], {}, set()


def _refuse_runtime_name(top: str, path: str) -> None:
    """A package named like a module the inspector runs on cannot be imported beside it."""
    if top in sys.modules and _is_runtime(top):
        where = _location(sys.modules[top]) or "built in"
        raise LoadError(
            f"{os.path.basename(path)} is in a package named '{top}', like the module "
            f"'{top}' the inspector itself runs on ({where}).",
            hint=f"Rename the folder {top}/ (and the imports naming it), e.g. to my_{top}/.",
        )


def _provided_names(folders: tuple[str, ...]) -> set[str]:
    """Top-level module names the folders offer: `name.py` files and package folders."""
    names: set[str] = set()
    for folder in folders:
        for entry in _entries(folder):
            stem, suffix = os.path.splitext(entry.name)
            if suffix == ".py" and entry.is_file():
                names.add(stem)
            elif entry.is_dir() and os.path.isfile(os.path.join(entry.path, "__init__.py")):
                names.add(entry.name)
    return {n for n in names if _importable(n) and not n.startswith("__")}


def _entries(folder: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError:  # listing refused: its modules still import, nothing is set aside
        return []


def _set_aside(name: str, paths: tuple[str, ...]) -> None:
    """Take `name` and its submodules out of sys.modules, unless they are the runtime's or
    the very files the user's folders offer (imported by this process before the load)."""
    if _is_runtime(name):
        return
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        if not _inside(_location(sys.modules[key]), list(paths)):
            _previous.set_aside[key] = sys.modules.pop(key)


def _is_runtime(name: str) -> bool:
    """Whether the module named `name` belongs to what the inspector stands on: the
    standard library, torch, inspector, or anything installed in the environment."""
    top = name.partition(".")[0]
    if top in _RUNTIME_NAMES or top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return True
    return _inside(_location(sys.modules.get(name)), _environment_dirs())


def _location(module: object) -> str | None:
    """The module's file, or its first folder (a namespace package); None when neither."""
    where = getattr(module, "__file__", None)
    if not where:
        where = next(iter(getattr(module, "__path__", None) or []), None)
    return os.path.realpath(where) if isinstance(where, str) else None


def _inside(path: str | None, folders: list[str]) -> bool:
    if path is None:
        return False
    return any(path == f or path.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


@lru_cache(maxsize=1)
def _environment_dirs() -> list[str]:
    """The Python installation and its site-packages."""
    paths = sysconfig.get_paths()
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    dirs |= {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return sorted({os.path.realpath(d) for d in dirs})
