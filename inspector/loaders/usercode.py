"""Turn an exception raised in the user's code into a `UserError` that shows their frames."""

from __future__ import annotations

import os
from collections.abc import Iterable

from inspector.errors import UserError
from inspector.tracebacks import format_user_traceback, user_location

__all__ = ["user_code_error", "syntax_error_location"]


def user_code_error(
    cls: type[UserError], what: str, exc: BaseException, user_files: Iterable[str], hint: str = ""
) -> UserError:
    """`cls("<what> raised <Type>: <msg>")` located at the innermost user frame.

    `what` says what we were doing, e.g. "importing model.py" or "building Net()".
    """
    user_files = list(user_files)
    if isinstance(exc, SyntaxError):
        location, line = syntax_error_location(exc)
    else:
        location, line = user_location(exc, user_files) or (None, None)
    message = f"{what} raised {type(exc).__name__}: {exc}"
    if location:
        message = f"{location}: {message}" + (f"\n    {line}" if line else "")
    return cls(
        message,
        hint=hint or None,
        location=location,
        user_traceback=format_user_traceback(exc, user_files),
    )


def syntax_error_location(exc: SyntaxError) -> tuple[str | None, str | None]:
    """("file.py:LINE", the offending line) of a SyntaxError."""
    if not exc.filename or exc.lineno is None:
        return None, None
    line = (exc.text or "").strip() or None
    return f"{os.path.basename(exc.filename)}:{exc.lineno}", line
