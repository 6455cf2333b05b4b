"""Load a model from a Python file: `model.py:Net` (a class) or `model.py:build` (a factory).

A file inside a package is imported as part of it (`mypkg/model.py` as `mypkg.model`), so
its absolute and relative imports work; a plain file runs as a fresh module with its folder
on `sys.path`, so sibling modules (a folder extracted from a .zip) import. See
`inspector.loaders.userimports`. Optional in the same file: `example_inputs()` and
`loss_fn(output, inputs)` and `generate_step(model, tokens, cache)`.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import itertools
import os
import re
import sys
import types
from typing import Any

import torch
from torch import nn

from inspector.context import LoadedModel
from inspector.errors import LoadError
from inspector.loaders.factories import ExampleFactory
from inspector.loaders.fakebuild import building_under, empty_weights, fake_weights, needs_values
from inspector.loaders.usercode import syntax_error_location, user_code_error
from inspector.loaders.userimports import ImportPlan, plan_import, prepare_imports

__all__ = ["split_source", "load_python"]

_RESERVED = ("example_inputs", "loss_fn", "generate_step")
_counter = itertools.count()


def split_source(source: str) -> tuple[str, str | None]:
    """("path/model.py", "Net") from "path/model.py:Net"; the entry is None when absent."""
    match = re.fullmatch(r"(.+\.py):([A-Za-z_][\w.]*)?", source)
    if match:
        return match.group(1), match.group(2)
    return source, None


def load_python(path: str, entry: str | None, *, fake_mode: Any, device: str) -> LoadedModel:
    """Import `path`, build `entry` (inside `fake_mode` when given) and move it to `device`."""
    if not os.path.isfile(path):
        raise LoadError(f"model file not found: {path}", hint="Check the path and try again.")
    data = open(path, "rb").read()  # noqa: SIM115 - read once, closed by refcount
    name = os.path.basename(path)
    module, user_files = _import_user_module(path, data)
    factory = _entrypoint(module, name, entry)
    model = _built(factory, name, entry, user_files, fake_mode, device)
    loaded = LoadedModel(
        model=model,
        source_kind="python",
        source_name=f"{name}:{entry}",
        sha256=hashlib.sha256(data).hexdigest(),
        entrypoint=entry,
        user_files=user_files,
        fake_mode=fake_mode,
    )
    if callable(getattr(module, "example_inputs", None)):
        loaded.inputs = ExampleFactory(module.example_inputs, model, user_files, name)
    if callable(getattr(module, "loss_fn", None)):
        loaded.loss_fn = module.loss_fn
    if callable(getattr(module, "generate_step", None)):
        loaded.generate_step = module.generate_step
    return loaded


def _built(
    factory: Any, name: str, entry: str | None, user_files: list[str], fake_mode: Any, device: str
) -> nn.Module:
    """Built on `device` directly: no copy, and fake parameters cannot be swapped by .to().
    A constructor that computes with tensor values (a linspace of drop-path rates read
    with `.tolist()`) cannot run under fake tensors: it is built again for real with its
    weights on the meta device, then they are made fake."""
    try:
        with building_under(fake_mode, device):
            return _move(_build(factory, name, entry, user_files), device)
    except LoadError as exc:
        if fake_mode is None or not needs_values(exc):
            raise
    with empty_weights(device):
        model = _build(factory, name, entry, user_files)
    return fake_weights(model, fake_mode, device)


def _move(model: nn.Module, device: str) -> nn.Module:
    """`model.to(device)` unless it is there already (tensors made with an explicit device)."""
    target = torch.device(device)
    tensors = itertools.chain(model.parameters(), model.buffers())
    if all(_same_device(t.device, target) for t in tensors):
        return model
    return model.to(device)


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (b.index is None or a.index == b.index)


def _user_paths(plan: ImportPlan) -> list[str]:
    """The folder the user's imports resolve from (the file's, or the package root's
    parent: modules beside the package are the user's too). When that folder also holds
    our own code or the Python environment: the package, else only the file."""
    ours = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), sys.prefix]
    ours.append(os.path.dirname(os.path.dirname(torch.__file__)))
    candidates = [plan.search_paths[0]]
    if plan.package is not None:
        candidates.append(os.path.join(plan.search_paths[0], plan.package))
    for folder in candidates:
        inside = folder.rstrip(os.sep) + os.sep
        if not any(os.path.realpath(p).startswith(inside) for p in ours):
            return [folder]
    return [plan.path]


def _import_user_module(path: str, data: bytes) -> tuple[types.ModuleType, list[str]]:
    """The imported file and the user's folders (for their frames in errors)."""
    plan = plan_import(path)
    user_files = _user_paths(plan)
    prepare_imports(plan)
    if plan.module_name is None:
        return _run_plain_file(path, data, user_files), user_files
    return _import_from_package(plan.module_name, plan, user_files), user_files


def _run_plain_file(path: str, data: bytes, user_files: list[str]) -> types.ModuleType:
    """Execute a file that is not in a package as a fresh module with a unique name."""
    name = os.path.basename(path)
    try:
        code = compile(data, path, "exec")
    except SyntaxError as exc:
        raise _syntax_error(exc) from None
    stem = re.sub(r"\W", "_", os.path.splitext(name)[0])
    module = types.ModuleType(f"_inspector_user_{next(_counter)}_{stem}")
    module.__file__ = os.path.abspath(path)
    sys.modules[module.__name__] = module  # dataclasses and pickling look the module up
    try:
        exec(code, module.__dict__)
    except SyntaxError as exc:  # in a sibling module it imports
        del sys.modules[module.__name__]
        raise _syntax_error(exc) from None
    except Exception as exc:
        del sys.modules[module.__name__]
        raise user_code_error(LoadError, f"importing {name}", exc, user_files) from exc
    return module


def _import_from_package(
    module_name: str, plan: ImportPlan, user_files: list[str]
) -> types.ModuleType:
    """`import mypkg.model`: the package's __init__ files run first, as in the user's repo."""
    name = os.path.basename(plan.path)
    try:
        module = importlib.import_module(module_name)
    except SyntaxError as exc:
        raise _syntax_error(exc) from None
    except Exception as exc:
        raise user_code_error(LoadError, f"importing {name}", exc, user_files) from exc
    found = getattr(module, "__file__", None)
    if not found or os.path.realpath(found) != plan.path:
        raise LoadError(
            f"importing {module_name} found {found or 'a module without a file'}, not {plan.path}.",
            hint=f"Another module named {plan.package} is in the way: rename your package.",
        )
    return module


def _syntax_error(exc: SyntaxError) -> LoadError:
    location, line = syntax_error_location(exc)
    where = os.path.basename(exc.filename or "") or "the model's code"
    message = f"syntax error in {where}: {exc.msg}" + (f"\n    {line}" if line else "")
    return LoadError(
        f"{location}: {message}" if location else message,
        location=location,
        hint="Fix the line above and upload again.",
    )


def _candidates(module: types.ModuleType) -> list[str]:
    """Classes (nn.Module subclasses) and functions the file defines itself."""
    names = []
    for key, obj in vars(module).items():
        if key.startswith("_") or key in _RESERVED:
            continue
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj) or (inspect.isclass(obj) and issubclass(obj, nn.Module)):
            names.append(key)
    return names


def _entrypoint(module: types.ModuleType, name: str, entry: str | None) -> Any:
    candidates = _candidates(module)
    usable = [c for c in candidates if not _required_args(getattr(module, c))]
    defined = f"(defined: {', '.join(candidates)})" if candidates else "(it defines no model)"
    use = " or ".join(f"{name}:{c}" for c in usable)
    hint = f"Use {use}." if usable else "Add a class or factory with no required arguments."
    if entry is None:
        raise LoadError(f"no entrypoint given for {name} {defined}.", hint=hint)
    obj: Any = module
    for part in entry.split("."):
        obj = getattr(obj, part, None)
    if obj is None:
        raise LoadError(f"entrypoint '{entry}' not found in {name} {defined}.", hint=hint)
    if not callable(obj):
        raise LoadError(
            f"entrypoint '{entry}' in {name} is a {type(obj).__name__}, not a class or function.",
            hint=hint,
        )
    return obj


def _required_args(obj: Any) -> list[str]:
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )
    return [p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]


def _build(factory: Any, name: str, entry: str | None, user_files: list[str]) -> nn.Module:
    required = _required_args(factory)
    if required:
        raise LoadError(
            f"{entry}() in {name} needs arguments: {', '.join(required)}.",
            hint=f"Give them defaults, or add a factory such as `def make_model(): return "
            f"{entry}(...)` and use {name}:make_model.",
        )
    try:
        model = factory()
    except Exception as exc:
        raise user_code_error(LoadError, f"building {entry}()", exc, user_files) from exc
    if not isinstance(model, nn.Module):
        raise LoadError(
            f"{entry}() in {name} returned a {type(model).__name__}, not an nn.Module.",
            hint="The entrypoint must be an nn.Module class or a function returning one.",
        )
    return model
