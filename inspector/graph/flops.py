"""FlopCounterMode with torch's own formulas, plus the CPU attention kernels it misses.

torch 2.13 counts scaled_dot_product_attention through its CUDA kernels (flash,
efficient, cudnn) but not `_scaled_dot_product_flash_attention_for_cpu`, so attention
counted 0 FLOPs on CPU. The CPU kernel takes (query, key, value) like the others: we map it
to torch's own sdpa formulas, no hand-written table.
"""

from __future__ import annotations

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["flop_counter_mode", "EXTRA_FORMULAS"]

_aten = torch.ops.aten


def _as_registered(op: object):  # noqa: ANN202
    """torch's registered (already shape-wrapped) formula of `op`, marked raw so that
    FlopCounterMode does not wrap it a second time."""
    formula = flop_counter.flop_registry[op]

    def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        return formula(*args, **kwargs)

    call._get_raw = True  # type: ignore[attr-defined]
    return call


def _extra() -> dict:
    pairs = {
        "_scaled_dot_product_flash_attention_for_cpu": _aten._scaled_dot_product_flash_attention,
        "_scaled_dot_product_flash_attention_for_cpu_backward": (
            _aten._scaled_dot_product_flash_attention_backward
        ),
    }
    return {
        getattr(_aten, name): _as_registered(like)
        for name, like in pairs.items()
        if hasattr(_aten, name) and like in flop_counter.flop_registry
    }


EXTRA_FORMULAS = _extra()


def flop_counter_mode(cls: type[FlopCounterMode] = FlopCounterMode) -> FlopCounterMode:
    return cls(display=False, custom_mapping=EXTRA_FORMULAS)
