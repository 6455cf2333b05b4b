"""Does a sandbox work on this host? Probed once, by running a trivial confined child."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from server.sandbox.bwrap import BWRAP
from server.sandbox.limits import Limits

__all__ = ["sandbox_available"]

PROBE_LIMITS = Limits(wall_s=30, memory_bytes=1024**3, cpu_s=30, max_procs=16, poll_s=0.02)


@lru_cache(maxsize=1)
def sandbox_available() -> tuple[bool, str]:
    """(True, "bubblewrap ...") when confined children run here, else (False, why)."""
    if not sys.platform.startswith("linux"):
        return False, f"the bubblewrap sandbox needs Linux (this is {sys.platform})"
    if not os.access(BWRAP, os.X_OK):
        return False, f"{BWRAP} is missing: install bubblewrap (Debian: apt install bubblewrap)"
    try:
        from server.sandbox.seccomp import seccomp_bpf

        seccomp_bpf()
    except (ImportError, OSError, RuntimeError) as exc:
        return False, f"no seccomp filter ({exc}): install pyseccomp and libseccomp2"
    return _trial_run()


def _trial_run() -> tuple[bool, str]:
    from server.sandbox.runner import run_child

    work = Path(tempfile.mkdtemp(prefix="inspector-probe-"))
    try:
        argv = [sys.executable, "-c", "import os; print('ok', os.getuid())"]
        outcome = run_child(argv, work, PROBE_LIMITS)
    except OSError as exc:
        return False, f"bubblewrap could not start: {exc}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if outcome.status == "done" and outcome.stdout.strip() == "ok 65534":
        return True, "bubblewrap sandbox with seccomp, rlimits and a watchdog"
    detail = (outcome.stderr or outcome.stdout).strip()[-500:]
    return False, (
        f"bubblewrap does not run here ({outcome.reason}): {detail}. User namespaces may be "
        "blocked (containers: allow them for the worker, see docker-compose.yml)."
    )
