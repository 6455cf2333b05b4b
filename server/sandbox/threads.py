"""How many intra-op threads a job child runs torch on (its OMP_NUM_THREADS), fresh or
forked from the zygote.

One thread is what lets a CPU job fork its passes (inspector/isolation.py: a native crash
then costs one pass) and run the passes that need only the graph beside the line, in lanes
that keep the other cores busy (inspector/beside.py). More threads keep every pass in one
process, one after another, where only real arithmetic (the load's forward, the gradients
pass, the measured step) uses the other cores: Dynamo's trace, `torch.export` and the fake
runs are single-threaded Python. On a small machine the lanes use the cores better (numbers
in bench/RESULTS.md, stop 53); on a large one a big model's real arithmetic may gain more
from the threads, which is not measured here, so it keeps them.
"""

from __future__ import annotations

import os

__all__ = ["job_threads", "FEW_CORES"]

FEW_CORES = 4  # the line and the passes beside it fill this many cores at once
_MOST_THREADS = 8


def job_threads(chosen: int | None = None, cores: int | None = None, *, gpu: bool = False) -> int:
    """`chosen` where given (INSPECTOR_JOB_THREADS, checked positive at start); else one
    thread on a CPU worker of at most FEW_CORES cores, the cores (up to 8) on a larger one
    and on a GPU worker (CUDA runs stay in one process: no lanes to fill the cores)."""
    if chosen is not None:
        return chosen
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if cores <= FEW_CORES and not gpu:
        return 1
    return min(cores, _MOST_THREADS)
