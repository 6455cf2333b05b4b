"""Collectives in flight: a real process group keeps a collective's tensors after the
caller is done with them, until its worker thread lets go of the finished work (gloo:
a thread per queue; NCCL: until the stream event is recorded). On one rank that is a
race with the next collective, so real peaks vary step to step by a unit's buffers.
The fake process group finishes at once; this keeps the tensors of the last `depth`
collectives (all-gathers and reduce-scatters together) alive instead, the worst case of
that race: gloo runs 2 worker threads per process group, each holding at most the work
it just finished.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["collectives_in_flight", "IN_FLIGHT"]

IN_FLIGHT = 2  # ProcessGroupGloo.Options.threads: works held past their wait, at most


@contextmanager
def collectives_in_flight(depth: int = IN_FLIGHT) -> Iterator[None]:
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as c

    classes: list[Any] = [c.DefaultAllGather, c.DefaultReduceScatter]
    saved = [(cls, cls.__call__) for cls in classes]
    held: deque = deque(maxlen=depth)

    def holding(call: Any) -> Any:
        def run(self: Any, output_tensor: Any, input_tensor: Any, *args: Any, **kw: Any) -> Any:
            if depth:
                held.append((output_tensor, input_tensor))
            return call(self, output_tensor, input_tensor, *args, **kw)

        return run

    for cls, call in saved:
        cls.__call__ = holding(call)
    try:
        yield
    finally:
        for cls, call in saved:
            cls.__call__ = call
        held.clear()
