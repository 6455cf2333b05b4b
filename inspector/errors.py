"""Errors that reach a user: what was wrong, where, and what to do.

`UserError` and its subclasses are the user's fault (bad file, bad input): the CLI
prints the message and exits 2, the service marks the job `failed` with kind
`user_error`. Anything else is our bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = [
    "InspectorError",
    "UserError",
    "LoadError",
    "InputSpecError",
    "InputMismatchError",
    "UserCodeError",
    "FakeModeLimit",
]


class InspectorError(Exception):
    """Base of every error this package raises on purpose."""


class UserError(InspectorError):
    """A problem with what the user gave us. `location` is "file.py:LINE" when known."""

    exit_code = 2
    kind = "user_error"

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        location: str | None = None,
        user_traceback: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.location = location
        self.user_traceback = user_traceback

    def __str__(self) -> str:
        text = self.message
        if self.location and self.location not in text:
            text = f"{self.location}: {text}"
        if self.hint:
            text = f"{text}\n{self.hint}"
        return text


class LoadError(UserError):
    """The model source cannot be loaded: missing file, entrypoint, syntax error, ..."""


class InputSpecError(UserError):
    """The input spec or tensor file does not parse."""


class InputMismatchError(UserError):
    """The inputs do not fit the model: names the first layer that rejects them."""


class UserCodeError(UserError):
    """The user's own code raised while we ran it."""


class FakeModeLimit(UserError):
    """--fake cannot run this model as it is: a limit of torch's fake tensors (the op and
    the reason are in the message), not a fault of the model or its inputs."""
