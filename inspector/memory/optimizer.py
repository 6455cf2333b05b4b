"""Optimizer state: which optimizer each option name means, and its bytes by hand.

State is allocated lazily by the first `step()` (as torch's optimizers do):
sgd keeps nothing, momentum one buffer per parameter (1x), Adam/AdamW `exp_avg` and
`exp_avg_sq` (2x, in the parameter's dtype) plus a float32 `step` scalar per parameter,
which lives on the CPU unless the optimizer is fused or capturable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from inspector.memory.tracker import storage_key

__all__ = ["make_optimizer", "optimizer_state_bytes", "state_bytes_of", "STATE_COPIES"]

# For each name of inspector.schema.options.OPTIMIZERS: the torch optimizer it stands
# for (None: no optimizer) and how many copies of each parameter its state keeps.
_OPTIMIZERS: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer] | None] = {
    "none": None,
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-3),
    "momentum": lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
}
STATE_COPIES = {"none": 0, "sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
_STEP_SCALAR_BYTES = 4  # torch.tensor(0.0, dtype=float32)


def make_optimizer(name: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer | None:
    """The optimizer an option name stands for (torch defaults otherwise), None for 'none'."""
    if name not in _OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; use one of {', '.join(_OPTIMIZERS)}")
    factory = _OPTIMIZERS[name]
    return None if factory is None else factory(params)


def optimizer_state_bytes(
    params: Iterable[torch.Tensor], name: str, device: str = "cpu"
) -> dict[str, int]:
    """State bytes by dtype for trainable `params` (each storage once), computed by hand."""
    copies = STATE_COPIES[name]
    out: dict[str, int] = {}
    seen: set[int] = set()
    for p in params:
        if not p.requires_grad or storage_key(p) in seen:
            continue
        seen.add(storage_key(p))
        dtype = str(p.dtype).removeprefix("torch.")
        out[dtype] = out.get(dtype, 0) + copies * p.numel() * p.element_size()
        if copies == 2 and device == "cpu":  # Adam's step counter, a CPU float32 scalar
            out["float32"] = out.get("float32", 0) + _STEP_SCALAR_BYTES
    return {k: v for k, v in out.items() if v}


def state_bytes_of(
    optimizer: torch.optim.Optimizer | None,
    view: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> int:
    """Bytes the optimizer's state really holds (each storage once); `view` maps a state
    tensor to what holds its bytes (a DTensor's local shard)."""
    if optimizer is None:
        return 0
    seen: dict[int, int] = {}
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                t = view(value)
                seen[storage_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())
