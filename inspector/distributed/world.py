"""A fake world: torch's FakeProcessGroup of any size, this process playing one rank.

Collectives on it return at once without touching data, so FSDP2 and DTensor run their
real code (sharding, all-gather and reduce-scatter buffers) with one process. The device
mesh must be made outside FakeTensorMode (it builds real tensors of rank ids).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from inspector.distributed.lazychunks import lazy_fsdp_chunks

__all__ = ["fake_world", "forget_world", "WorldBusy"]


class WorldBusy(RuntimeError):
    """This process already has a default process group (a real run under torchrun)."""


@contextmanager
def fake_world(
    world_size: int,
    rank: int = 0,
    shape: tuple[int, ...] | None = None,
    names: tuple[str, ...] | None = None,
) -> Iterator[Any]:
    """A CPU device mesh over a fake default group of `world_size` ranks: 1-D, or of
    `shape` with dims `names` (a 2-D ("dp", "tp") mesh)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise WorldBusy("a process group is already initialized in this process")
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        with warnings.catch_warnings(), lazy_fsdp_chunks(), _meshes_concatenated_once():
            # FSDP2's advice to people who train with it, printed on every plan we run:
            # the user asked for a figure, not for FSDP's run-time warnings
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module", category=UserWarning)
            yield init_device_mesh("cpu", shape or (world_size,), mesh_dim_names=names)
    finally:
        forget_world()


@contextmanager
def _meshes_concatenated_once() -> Iterator[None]:
    """FSDP2 over TP joins the dp and tp meshes once per parameter (`DeviceMesh._concatenate`),
    each a new mesh whose rank-id tensors are rebuilt under FakeTensorMode: 25 ms a
    parameter, a third of a Llama-3-70B 2-D rank run. The joined mesh depends only on the
    two meshes, so it is made once per pair (equal meshes: one pair) while the world lasts."""
    from torch.distributed.device_mesh import DeviceMesh

    original = getattr(DeviceMesh, "_concatenate", None)
    if original is None:  # an older torch joins its meshes another way
        yield
        return
    made: dict[tuple[Any, ...], Any] = {}

    def once(meshes: list[Any]) -> Any:
        key = tuple(meshes)  # meshes hash and compare by layout, ranks and names
        if key not in made:
            made[key] = original(meshes)
        return made[key]

    DeviceMesh._concatenate = staticmethod(once)
    try:
        yield
    finally:
        DeviceMesh._concatenate = staticmethod(original)


def forget_world() -> None:
    """End the fake world, and drop DTensor's caches with it: they are keyed by meshes,
    which compare equal across worlds of one shape, and hold that world's meshes, whose
    process groups are gone (a 2-D world as rank 0 after one as rank 4 failed with
    "Could not resolve the process group registered under the name 5")."""
    from torch.distributed.tensor import DTensor, _redistribute

    dist.destroy_process_group()
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    _redistribute._gen_transform_infos.cache_clear()
    _redistribute.clear_redistribute_planner_cache()
    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ dispatch's own
