"""One fit plan and what it costs.

Cost is compared in this order: GPUs (a plan on one GPU beats any sharded one), numerical
risk from medium up (a low risk, such as bf16 autocast, is what mixed-precision training
takes everywhere: it does not outrank compute), extra compute (recompute FLOPs per step
FLOPs), micro-steps per optimizer step (smaller micro-batches use an accelerator less
well), then low risk.
- bf16 autocast: low risk (standard mixed precision, float32 master weights), no compute.
- activation checkpointing: no risk (the same arithmetic), the blocks' forward again;
  selective (per op: matmul outputs kept, element-wise ops recomputed): no matmul FLOPs.
- gradient accumulation: no risk, no extra FLOPs, except that BatchNorm then normalises
  over the micro-batch (low risk).
- a lighter optimizer (AdamW -> SGD with momentum -> SGD): medium risk (other training
  dynamics: the learning rate needs retuning).
- bf16 parameters: high risk (updates smaller than bf16's precision are lost).
- sharding (FSDP over N GPUs): N GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Candidate", "RISKS", "risk_of", "LIGHTER_OPTIMIZERS"]

RISKS = ("none", "low", "medium", "high")

# The optimizers a plan may switch to, lightest state last; each runs on fake tensors.
# (torch.optim.Adafactor would keep less state than AdamW, but its step calls .item() on
# the parameters' norm, which fake tensors cannot answer: it cannot be verified here.)
LIGHTER_OPTIMIZERS = {
    "adamw": ("momentum", "sgd"),
    "adam": ("momentum", "sgd"),
    "momentum": ("sgd",),
}


@dataclass(frozen=True)
class Candidate:
    optimizer: str
    micro_batch: int | None  # None: the inputs have no batch dim to split
    accumulation: int = 1  # micro-steps per optimizer step
    autocast: bool = False  # bf16 autocast newly turned on
    bf16_params: bool = False  # parameters (and so gradients, state) cast to bf16
    checkpoint: tuple[str, ...] = ()  # block paths run under torch.utils.checkpoint
    selective: bool = False  # the other blocks keep only their matmul outputs (selective)
    gpus: int = 1  # FSDP ranks; 1: no sharding
    batchnorm: bool = False  # the model has BatchNorm: accumulation changes its statistics
    extra_compute: float = 0.0  # predicted recompute FLOPs / step FLOPs
    changed_optimizer: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def risk(self) -> int:
        return risk_of(self)

    def cost(self) -> tuple[int, int, float, int, int, int]:
        serious = self.risk if self.risk >= RISKS.index("medium") else 0
        return (self.gpus, serious, round(self.extra_compute, 4), self.accumulation,
                int(self.selective), self.risk)  # fmt: skip

    def summary(self) -> str:
        parts = []
        if self.gpus > 1:
            parts.append(f"FSDP on {self.gpus} GPUs")
        if self.autocast:
            parts.append("bf16 autocast" if self.gpus == 1 else "bf16 MixedPrecisionPolicy")
        if self.bf16_params:
            parts.append("bf16 parameters")
        if self.changed_optimizer:
            parts.append(f"optimizer {self.optimizer}")
        if self.checkpoint:
            parts.append(f"checkpoint {len(self.checkpoint)} block(s)")
        if self.selective:
            parts.append("selective checkpointing of the others")
        if self.accumulation > 1:
            parts.append(f"micro-batch {self.micro_batch} x {self.accumulation} accumulation")
        return ", ".join(parts) or "no changes"


def risk_of(c: Candidate) -> int:
    """The largest numerical risk among the candidate's changes, as an index of RISKS."""
    risk = 0
    if c.autocast or (c.accumulation > 1 and c.batchnorm):
        risk = 1
    if c.changed_optimizer:
        risk = 2
    if c.bf16_params:
        risk = 3
    return risk
