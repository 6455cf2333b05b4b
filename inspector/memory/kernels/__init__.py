"""Kernel memory below the aten-op level: a registry of per-op formulas (`registry`) and
the kernels they describe (`onednn_rnn`, `onednn_conv`, `batchnorm`)."""

from inspector.memory.kernels import (  # noqa: F401  (register formulas)
    batchnorm,
    onednn_conv,
    onednn_rnn,
)
from inspector.memory.kernels.registry import (
    FORMULAS,
    UNKNOWN,
    KernelMemory,
    kernel_memory,
    op_name,
)

__all__ = ["KernelMemory", "kernel_memory", "op_name", "FORMULAS", "UNKNOWN"]
