"""Selective activation checkpointing: a block keeps the outputs of its matmuls,
convolutions and attention (costly to recompute) and recomputes the rest in backward
(activations, norms, dropout: cheap element-wise ops whose outputs are often as large).

`selective(model, paths)` runs each block at `paths` under `torch.utils.checkpoint` with
`create_selective_checkpoint_contexts` and the policy below, as a user would write it
(`SNIPPET`); the saving is measured on fake tensors, since which tensors a block keeps
then depends on its ops, not on its module boundaries.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from inspector.memory.checkpointing import forwards_wrapped

__all__ = ["selective", "SAVED_OPS", "SNIPPET"]

_aten = torch.ops.aten
SAVED_OPS = {
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
    _aten.convolution.default, _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
}  # fmt: skip


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective(forward: Any) -> Any:
    context = partial(create_selective_checkpoint_contexts, _policy)

    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=False,
                          context_fn=context, **kwargs)  # fmt: skip

    return run


def selective(model: nn.Module, paths: list[str]) -> AbstractContextManager[None]:
    """Within the block, the modules at `paths` keep only their matmul outputs."""
    return forwards_wrapped(model, paths, _selective)


SNIPPET = """import functools
import torch
from torch.utils.checkpoint import (
    CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts)

aten = torch.ops.aten
SAVE = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default}

def policy(ctx, op, *args, **kwargs):  # keep matmul outputs, recompute the rest
    return CheckpointPolicy.MUST_SAVE if op in SAVE else CheckpointPolicy.PREFER_RECOMPUTE

context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
for name in NAMES:
    block = model.get_submodule(name)
    block.forward = functools.partial(
        checkpoint, block.forward, use_reentrant=False, context_fn=context_fn)"""
