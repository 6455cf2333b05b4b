"""An optimizer step over the fewest parameters that decide its bytes.

torch's per-parameter loop (its choice for CPU tensors) updates one parameter at a time:
each iteration's temporaries live until the next iteration rebinds their names, so the
step's peak is set by a pair of neighbours, and each parameter's state depends only on
its kind (shape, stride, dtype, device). Over a subsequence of the parameters in which
every pair of neighbours is a pair of neighbouring kinds of the whole list, every such
pair appears, and the first parameter comes first, a step allocates the same state per
kind and peaks at the same temporaries; the state of the other parameters is that of
their kind. A stack of 200 identical blocks needs one block's worth, and a head after it
a few more (a prefix would have needed all of them: CaiT's 476 parameters hold 19 pairs).
Batched (foreach or fused) steps, which allocate for all parameters at once, run over
every parameter.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from inspector.fakevalues import value_of
from inspector.memory.tracker import storage_key

__all__ = [
    "kind", "pairs_walk", "looped", "deciding", "stepping", "copy_state_by_kind",
    "state_bytes",
]  # fmt: skip


def kind(p: torch.Tensor) -> tuple:
    """What a parameter's state and temporaries depend on. A DTensor's also depend on its
    placements: a replicated norm weight and a sharded bias of the same global shape hold
    different bytes."""
    local = getattr(p, "_local_tensor", None)
    shard = () if local is None else (tuple(local.shape), local.stride(), tuple(p.placements))
    return (tuple(p.shape), p.stride(), p.dtype, p.device, *shard)


def deciding(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The parameters a step must run over for its bytes, in order: a walk over every pair
    of neighbouring kinds when torch loops over them, else all."""
    walk = [params[i] for i in pairs_walk([kind(p) for p in params])]
    if len(walk) < len(params) and not looped(walk):
        return list(params)
    return walk


def pairs_walk(kinds: list[tuple]) -> list[int]:
    """Indices into `kinds`, rising from 0, whose neighbours are all neighbours somewhere in
    `kinds` and take in every such pair. A new pair at i is reached from the last index
    taken through the shortest run of indices ending at i whose first kind follows the
    last one's somewhere (the last block before a head, say); at worst every index between.
    """
    pairs = set(zip(kinds, kinds[1:], strict=False))
    walk, seen = [0] if kinds else [], set()
    for i in range(1, len(kinds)):
        if (kinds[i - 1], kinds[i]) in seen:
            continue
        last = walk[-1]  # on to i - 1, then i: that pair is the one to take in
        start = next((j for j in range(i - 1, last, -1) if (kinds[last], kinds[j]) in pairs), i)
        for j in range(start, i + 1):
            seen.add((kinds[walk[-1]], kinds[j]))
            walk.append(j)
        if len(seen) == len(pairs):
            break
    return walk


def looped(params: Sequence[torch.Tensor]) -> bool:
    """Whether torch steps these parameters one by one (neither foreach nor fused)."""
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach
    except ImportError:  # a torch that decides otherwise: run every parameter
        return False
    return not any(
        _default_to_fused_or_foreach(list(params), differentiable=False, use_fused=False)
    )


@contextmanager
def stepping(
    optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]
) -> Iterator[list[torch.Tensor]]:
    """Within the block, `optimizer.step()` runs over the deciding parameters of `params`
    (its one parameter group, narrowed); yields them."""
    walk = deciding(params)
    groups = optimizer.param_groups
    if len(walk) == len(params) or len(groups) != 1 or not _same(groups[0]["params"], params):
        yield list(params)
        return
    whole = groups[0]["params"]
    groups[0]["params"] = walk
    try:
        yield walk
    finally:
        groups[0]["params"] = whole


def _same(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def copy_state_by_kind(
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.Tensor],
    stepped: Sequence[torch.Tensor],
) -> None:
    """Give each parameter the step did not reach a copy of the state of its kind, as the
    step would have made it (call under the parameters' fake mode, if any)."""
    template: dict[tuple, dict[str, Any]] = {}
    for p in stepped:
        template.setdefault(kind(p), optimizer.state.get(p, {}))
    ran = {id(p) for p in stepped}
    for p in (p for p in params if id(p) not in ran):
        state = template.get(kind(p))
        if state and p not in optimizer.state:
            optimizer.state[p] = {name: _like(value) for name, value in state.items()}


def _like(value: Any) -> Any:
    """A fresh tensor like a state tensor, holding its value. A fake one is made from a
    meta tensor (about 60 us) rather than by a fake `clone` (180 us, 490 us for the step
    counter): the state of a 200-block stack is 3,600 of them. A fake's only value is a
    constant (the step counter's), which is copied."""
    if not isinstance(value, torch.Tensor):
        return value
    mode = getattr(value, "fake_mode", None)
    converter = getattr(mode, "fake_tensor_converter", None)
    if type(value) is not FakeTensor or converter is None or value_of(value) is not None:
        return value.clone()
    with unset_fake_temporarily():  # a plain meta tensor, not a fake dispatch
        meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        constant = None if value.constant is None else value.constant.clone()
    fake = converter.from_meta_and_device(mode, meta, value.device)
    fake.constant = constant
    return fake


def state_bytes(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> int:
    """The bytes of one parameter's state (each storage once)."""
    tensors = [t for t in optimizer.state.get(p, {}).values() if isinstance(t, torch.Tensor)]
    return sum({storage_key(t): t.untyped_storage().nbytes() for t in tensors}.values())
