"""What one rank holds during a training step: the figures every strategy reports."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RankMemory"]


@dataclass
class RankMemory:
    strategy: str  # the plan's normal form, e.g. "fsdp:8,reshard=false"
    world_size: int
    rank: int  # the heaviest rank, the one these figures are for
    peak_bytes: int  # the accelerator's (under CPU offload the host's share is apart)
    peak_phase: str  # forward / backward / optimizer
    peak_label: str | None  # the module or autograd node running at the peak
    param_bytes: int  # resident: this rank's parameters (its shards under FSDP)
    grad_bytes: int  # after backward: this rank's gradients
    optimizer_bytes: int  # this rank's optimizer state
    input_bytes: int
    saved_activation_bytes: int  # saved for backward, gathered parameters left out
    comm_bytes: int  # DDP: its buckets; FSDP: the largest unit's all-gather + reduce-scatter
    host_bytes: int = 0  # CPU offload: the shards, their gradients and optimizer state
    units: int = 1  # FSDP: fully_shard units (blocks + root); DDP: gradient buckets
    phase_peaks: dict[str, int] = field(default_factory=dict)  # forward / backward / optimizer
    phase_labels: dict[str, str | None] = field(default_factory=dict)  # what ran at each
    # "phase|kind" -> (highest live bytes, label): memory.tracker's kind_peaks, for scaling
    kind_peaks: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
