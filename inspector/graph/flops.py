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
from torch.utils.module_tracker import ModuleTracker

__all__ = ["forward_flop_counter", "EXTRA_FORMULAS"]

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


class _ForwardModuleTracker(ModuleTracker):
    """torch's ModuleTracker without its backward hooks. Those hooks need every module
    input that says `requires_grad` to have a grad function or accumulator; under
    `no_grad` a model can hand a module such a tensor without either (CaiT's
    `cls_token.expand(B, -1, -1)`), and torch raises. A forward-only count needs none."""

    def _fw_pre_hook(self, mod, input) -> None:  # noqa: ANN001, A002
        self._get_append_fn(self._get_mod_name(mod), False)()

    def _fw_post_hook(self, mod, input, output) -> None:  # noqa: ANN001, A002
        self._get_pop_fn(self._get_mod_name(mod), False)()


# The private hooks replaced above, checked once: where a torch lacks them, the counter
# keeps torch's own tracker.
_TRACKER_REPLACEABLE = all(
    hasattr(ModuleTracker, name)
    for name in ("_fw_pre_hook", "_fw_post_hook", "_get_append_fn", "_get_pop_fn", "_get_mod_name")
)


def forward_flop_counter() -> FlopCounterMode:
    """torch's FlopCounterMode for a count under `no_grad`: it never sees a backward, so
    its module tracker sets no backward hooks."""
    counter = FlopCounterMode(display=False, custom_mapping=EXTRA_FORMULAS)
    if _TRACKER_REPLACEABLE and isinstance(getattr(counter, "mod_tracker", None), ModuleTracker):
        counter.mod_tracker = _ForwardModuleTracker()
    return counter
