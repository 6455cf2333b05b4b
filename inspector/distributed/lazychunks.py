"""FSDP2's parameter chunking, made lazy for our one-rank runs.

`fully_shard` splits every parameter into world-size chunks (`_chunk_with_empty`, one
`torch.chunk` view per rank) and then reads two of them: its own rank's and chunk 0 (the
padded size). At 117 ranks that is 117 fake views a parameter, a quarter of a whole
fake step of a Llama layer. `LazyChunks` is the same list, each chunk made when it is
read, with `torch.chunk`'s sizes: ceil(n / N) rows a chunk, the last one short, and empty
1-D tensors past the rows (as `_chunk_with_empty` pads the list).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["LazyChunks", "lazy_fsdp_chunks"]


class LazyChunks(Sequence):
    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int) -> None:
        self.tensor, self.num_chunks, self.dim = tensor, num_chunks, dim
        self.rows = tensor.size(dim)
        self.chunk = -(-self.rows // num_chunks)

    def __len__(self) -> int:
        return self.num_chunks

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.num_chunks))]
        if i < 0:
            i += self.num_chunks
        if not 0 <= i < self.num_chunks:
            raise IndexError(i)
        start = i * self.chunk
        if start >= self.rows:
            return self.tensor.new_empty(0)
        return self.tensor.narrow(self.dim, start, min(self.chunk, self.rows - start))


def _lazy(tensor: torch.Tensor, num_chunks: int, dim: int) -> Sequence[torch.Tensor]:
    if tensor.size(dim) == 0:  # torch.chunk's own answer for no rows: keep it
        return _original(tensor, num_chunks, dim)
    return LazyChunks(tensor, num_chunks, dim)


def _original(tensor: torch.Tensor, num_chunks: int, dim: int) -> list[torch.Tensor]:
    from torch.distributed.fsdp._fully_shard import _fsdp_common

    return _fsdp_common._chunk_with_empty(tensor, num_chunks, dim)


@contextmanager
def lazy_fsdp_chunks() -> Iterator[None]:
    """`fully_shard` chunks lazily while this lasts (its module's own name is replaced)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    saved = _fsdp_param._chunk_with_empty
    _fsdp_param._chunk_with_empty = _lazy
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = saved
