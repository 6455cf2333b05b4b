"""Memory a kernel allocates that its aten op's outputs do not show, one formula per op.

The live tracker sees each aten op's outputs. Below that level a CPU kernel allocates
through the same allocator: oneDNN's LSTM keeps a workspace for backward (an output that
the fake kernel makes 0 bytes), reorders weights and activations into blocked layouts and
takes a scratchpad, all freed before the op returns. A formula registered here for an op
says, from the op's arguments, how big those are, so that fake and real runs count what
the allocator counts. A formula returns None for a call it does not know (another device,
dtype or path); ops listed in `UNKNOWN` have kernel memory that cannot be known before
they run (cuDNN picks its algorithm and workspace at run time). The tracker reports both
kinds by name: the estimate says what it left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "KernelMemory",
    "formula",
    "kernel_memory",
    "measured_here",
    "on_avx2",
    "simd_floats",
    "FORMULAS",
    "UNKNOWN",
    "op_name",
]

aten = torch.ops.aten


@dataclass(frozen=True)
class KernelMemory:
    """What one call allocates beyond its outputs as the tracker sees them."""

    scratch_bytes: int = 0  # live only inside the call, on top of its outputs
    # flat output index -> the bytes the real kernel gives it (a fake kernel may say 0)
    output_bytes: dict[int, int] = field(default_factory=dict)
    partial: bool = False  # a lower bound: part of this call's kernel memory is not known


Formula = Callable[[tuple, dict, Any], KernelMemory | None]
FORMULAS: dict[Any, Formula] = {}

# Kernels whose own memory is chosen at run time, or whose formula is not written: their
# calls are named in the report (memory.unmodelled_kernel_ops) instead of counted.
UNKNOWN: frozenset[Any] = frozenset(
    {
        aten._cudnn_rnn.default,
        aten._cudnn_rnn_backward.default,
        aten.cudnn_convolution.default,
        aten.cudnn_convolution_transpose.default,
        aten.miopen_rnn.default,
    }
)


# float32 lanes of the vector ISA oneDNN runs on, for the CPUs its formulas were measured
# on: its channel blocks are this wide (AVX-512 on Intel Xeon, AVX2 on AMD EPYC)
_LANES = {"AVX512": 16, "AVX2": 8}


def simd_floats() -> int:
    """16 on AVX-512, 8 on AVX2; 0 on another CPU (no formula applies there)."""
    return _LANES.get(torch.backends.cpu.get_cpu_capability(), 0)


def measured_here() -> bool:
    """The oneDNN formulas were measured on AVX-512 (16-float channel blocks) and AVX2 (8)
    CPUs; on another ISA oneDNN picks other blocks and kernels, so their calls are
    reported instead."""
    return simd_floats() > 0


def on_avx2() -> bool:
    """AVX2: the same formulas with 8-float blocks, byte-exact on fewer kernels (the rest
    are reported as partial: inspector/memory/kernels/onednn_conv.py)."""
    return simd_floats() == 8


def formula(*ops: Any) -> Callable[[Formula], Formula]:
    """Register `fn` as the kernel-memory formula of `ops`; a second formula is a bug."""

    def register(fn: Formula) -> Formula:
        for op in ops:
            if op in FORMULAS:
                raise ValueError(f"a kernel-memory formula for {op} is already registered")
            FORMULAS[op] = fn
        return fn

    return register


def kernel_memory(func: Any, args: tuple, kwargs: dict, out: Any) -> KernelMemory | None:
    """The formula's answer, or None: no formula for this op, or not for this call."""
    fn = FORMULAS.get(func)
    if fn is None:
        return None
    try:
        return fn(args, kwargs, out)
    except Exception:  # noqa: BLE001 - a formula's bug must not cost the memory section;
        return None  # the op is then reported as not modelled


def op_name(func: Any, args: tuple = ()) -> str:
    """`convolution`, or `convolution (cuda)` for a call on another device than the CPU."""
    name = str(func).removeprefix("aten.").removesuffix(".default")
    device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
    return name if device == "cpu" else f"{name} ({device})"
