"""The job sandbox: bubblewrap + seccomp + rlimits + a parent-side watchdog.

`run_child(argv, job_dir, limits)` runs one child confined and returns an `Outcome`
(done, failed, timed_out, out_of_memory, killed, with a reason); `sandbox_available()`
says once whether this host can confine children at all. `forked.run_forked` runs a job
as a child of a pre-warmed zygote (`zygote.py`, one per worker thread: `pool.py`), watched
the same way and named the same way.
"""

from __future__ import annotations

from server.sandbox.bwrap import JOB_MOUNT
from server.sandbox.limits import Limits
from server.sandbox.probe import sandbox_available
from server.sandbox.runner import Outcome, job_python_command, run_child

__all__ = ["JOB_MOUNT", "Limits", "Outcome", "job_python_command", "run_child", "sandbox_available"]
