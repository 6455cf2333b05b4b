"""What a library prints while it fails goes into the report, not onto the terminal.

A failing `torch.export` writes the partial graph it traced (180 KB on a detection model)
and its log lines to stderr: through `sys.stderr`, through logging handlers that hold the
terminal's stream, or from C++ straight to file descriptor 2. `library_output_captured`
catches all three in a temporary file; `printed_summary` keeps its first and last lines
for the capture attempt's message (what failed is usually at the end of the dump).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass

__all__ = ["Printed", "library_output_captured", "printed_summary", "attach_printed", "printed"]

_HEAD_LINES, _TAIL_LINES, _MAX_CHARS = 4, 12, 1500
_ATTRIBUTE = "_inspector_printed"  # on an exception: what the library printed meanwhile
# torch's C++ and logging lines start "W1204 18:07:32.634000 15177 file:line] ": the date,
# time and process id make two reports of one model differ; the level is kept
_LOG_PREFIX = re.compile(r"^([IWEF])\d{4} \d{2}:\d{2}:\d{2}\.\d+ +\d+ ")


@dataclass
class Printed:
    text: str = ""


@contextmanager
def library_output_captured() -> Iterator[Printed]:
    """Everything written to stderr meanwhile, in `.text` when the block ends."""
    printed = Printed()
    for stream in (sys.stderr, sys.__stderr__):
        if stream is not None:
            stream.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        text_stream = open(caught.fileno(), "w", closefd=False, encoding="utf-8")  # noqa: SIM115
        try:
            with redirect_stderr(text_stream):
                yield printed
        finally:
            text_stream.flush()
            if sys.__stderr__ is not None:
                sys.__stderr__.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            printed.text = caught.read().decode("utf-8", errors="replace")


def printed_summary(text: str) -> str:
    """The first and last lines of `text`, with how much was left out between them.
    Terminal control lines (a progress bar redrawn meanwhile) are dropped, and log lines
    keep their level without their time and process id."""
    lines = [
        _LOG_PREFIX.sub(r"\1 ", line)
        for line in text.splitlines()
        if line.strip() and "\x1b" not in line
    ]
    if not lines:
        return ""
    kept = lines
    if len(lines) > _HEAD_LINES + _TAIL_LINES:
        left_out = len(lines) - _HEAD_LINES - _TAIL_LINES
        kept = [*lines[:_HEAD_LINES], f"... ({left_out} lines left out) ...", *lines[-_TAIL_LINES:]]
    summary = "\n".join(line if len(line) <= 200 else line[:200] + " ..." for line in kept)
    if len(summary) > _MAX_CHARS:
        summary = summary[: _MAX_CHARS // 3] + "\n...\n" + summary[-2 * _MAX_CHARS // 3 :]
    return f"it printed {len(text):,} characters on stderr:\n{summary}"


def attach_printed(exc: BaseException, text: str) -> None:
    """Remember on `exc` what was printed while it was raised."""
    if text.strip():
        setattr(exc, _ATTRIBUTE, text)


def printed(exc: BaseException) -> str:
    return getattr(exc, _ATTRIBUTE, "")
