"""The stored timeline: one point per module call / autograd node, capped in length.

Huge graphs give tens of thousands of points; keeping every k-th point would miss the
peak, so the downsampling keeps, in each bucket of consecutive points, its highest one,
and always the first and last point of each phase.
"""

from __future__ import annotations

from inspector.memory.tracker import Point
from inspector.report import TimelinePoint

__all__ = ["downsample", "MAX_POINTS"]

MAX_POINTS = 2000


def downsample(points: list[Point], limit: int = MAX_POINTS) -> list[TimelinePoint]:
    keep = set(range(len(points)))
    if len(points) > limit:
        size = -(-len(points) // (limit // 2))  # buckets of `size`, room for phase ends
        keep = {
            max(range(i, min(i + size, len(points))), key=lambda j: points[j].live_bytes)
            for i in range(0, len(points), size)
        }
        for i, p in enumerate(points):
            if i in (0, len(points) - 1) or p.phase != points[i - 1].phase:
                keep.update({i, max(i - 1, 0)})
    return [
        TimelinePoint(
            step=i,
            phase=_phase(points[i].phase),
            node=points[i].label,
            live_bytes=points[i].live_bytes,
        )
        for i in sorted(keep)
    ]


def _phase(phase: str) -> str:
    return phase if phase in ("forward", "backward", "optimizer") else "forward"
