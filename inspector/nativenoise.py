"""Keep native libraries' chatter off the user's terminal.

torch's profiler (kineto) writes `USDT:... profiler_start` / `profiler_stop` (and at
higher log levels `STAGE:...`) straight to file descriptor 2 from C++, with no setting
that silences it. Around such a call we point fd 2 at a temporary file, then copy back
every line that is not that noise, so anything else written meanwhile (the user's own
prints, a real warning) still reaches stderr, in order.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["NOISE_PREFIXES", "native_noise_filtered"]

NOISE_PREFIXES = (b"USDT:", b"STAGE:")


@contextmanager
def native_noise_filtered(prefixes: tuple[bytes, ...] = NOISE_PREFIXES) -> Iterator[None]:
    """Drop the lines starting with `prefixes` that anything writes to fd 2 meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught if not line.startswith(prefixes)]
            if kept:
                os.write(2, b"".join(kept))
