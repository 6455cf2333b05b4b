"""Turn an exception raised in the user's code into a `UserError` that shows their frames."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pkgutil
import sys
from collections.abc import Iterable
from pathlib import Path

from inspector.errors import UserError
from inspector.schema.libraries import MODEL_LIBRARIES
from inspector.tracebacks import format_user_traceback, user_location

__all__ = ["user_code_error", "syntax_error_location", "MODEL_LIBRARIES"]

_NO_PARENT = "attempted relative import with no known parent package"


def user_code_error(
    cls: type[UserError], what: str, exc: BaseException, user_files: Iterable[str], hint: str = ""
) -> UserError:
    """`cls("<what> raised <Type>: <msg>")` located at the innermost user frame.

    `what` says what we were doing, e.g. "importing model.py" or "building Net()". A
    failed import says what is missing and what to do instead.
    """
    user_files = list(user_files)
    if isinstance(exc, SyntaxError):
        location, line = syntax_error_location(exc)
    else:
        location, line = user_location(exc, user_files) or (None, None)
    message = f"{what} raised {type(exc).__name__}: {exc}"
    message, import_hint = _explain_import(exc, user_files, message)
    if location:
        message = f"{location}: {message}" + (f"\n    {line}" if line else "")
    return cls(
        message,
        hint=hint or import_hint,
        location=location,
        user_traceback=format_user_traceback(exc, user_files),
    )


def syntax_error_location(exc: SyntaxError) -> tuple[str | None, str | None]:
    """("file.py:LINE", the offending line) of a SyntaxError."""
    if not exc.filename or exc.lineno is None:
        return None, None
    line = (exc.text or "").strip() or None
    return f"{os.path.basename(exc.filename)}:{exc.lineno}", line


def _explain_import(
    exc: BaseException, user_files: list[str], message: str
) -> tuple[str, str | None]:
    """(message, hint) saying what an import that failed lacks; others pass unchanged."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top, parent = exc.name.partition(".")[0], exc.name.rpartition(".")[0]
        if _is_folder_of(top, user_files):
            return message, (
                f"{top}/ holds your file but is not a package: add an empty __init__.py to "
                f"{top}/ (and to each folder between it and your file) so `import {top}` works."
            )
        if not _is_users(top, user_files):
            return _missing_library(exc.name)
        if parent:
            return _missing_own_module(exc.name, parent)
    if isinstance(exc, ImportError) and _NO_PARENT in str(exc):
        hint = (
            "The file is not inside a package: add an empty __init__.py to its folder (and "
            "upload that folder, zipped) so `from .module import ...` works."
        )
        return message, hint
    return message, None


def _missing_library(name: str) -> tuple[str, str]:
    """`No module named 'einops': the worker has torch 2.5.1, transformers 4.46.0; not einops.`"""
    top = name.partition(".")[0]
    message = f"No module named {name!r}: {_runtime_name()} has {_libraries()}; not {top}."
    if _runtime_name() == "the worker":
        return message, "Vendor it into your upload or ask the operator to install it."
    return message, "Install it here, or vendor it into the folder beside your model."


def _missing_own_module(name: str, parent: str) -> tuple[str, str]:
    """A module of the user's own package that is not there (a typo, a file left out)."""
    package = sys.modules.get(parent)
    found = sorted(m.name for m in pkgutil.iter_modules(getattr(package, "__path__", None) or []))
    listing = f" (it has: {', '.join(found)})" if found else ""
    child = name.rpartition(".")[2]
    message = f"No module named {name!r}: your package {parent} has no module {child}{listing}."
    return message, "Check the import's spelling and that the file is in your upload."


def _is_folder_of(top: str, user_files: list[str]) -> bool:
    """Whether `top` names the user's folder or its parent: a package without its
    `__init__.py`, so the file was not imported as part of it."""
    return any(top in Path(f).parts[-2:] for f in user_files if os.path.isdir(f))


def _is_users(top: str, user_files: list[str]) -> bool:
    """Whether `top` is a package or module in the user's folders."""
    folders = [f for f in user_files if os.path.isdir(f)]
    return any(
        os.path.isfile(os.path.join(folder, top, "__init__.py"))
        or os.path.isfile(os.path.join(folder, f"{top}.py"))
        for folder in folders
    )


def _libraries() -> str:
    """Torch and the importable MODEL_LIBRARIES, with versions: "torch 2.5.1, timm 1.0"."""
    import torch

    found = [f"torch {torch.__version__}"]
    for name in MODEL_LIBRARIES:
        if _importable(name):
            found.append(f"{name} {_version(name)}".strip())
    return ", ".join(found)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _runtime_name() -> str:
    """Who runs the code, for messages: "the worker" in the service's job child
    (`python -m inspector.job`), else "this Python" (the CLI, a notebook)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return "the worker" if getattr(spec, "name", None) == "inspector.job" else "this Python"
