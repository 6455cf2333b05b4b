"""The `--parallel STRATEGY:N[,key=value...]` grammar, torch-free: the CLI, the upload
form and the API read a plan spec the same way.

    ddp:4                          DistributedDataParallel on 4 ranks (bucket_cap_mb=25)
    ddp:4,bucket_mb=50             larger gradient buckets
    zero1:4                        DDP + ZeroRedundancyOptimizer: optimizer state sharded
    fsdp:8                         FSDP2: fully_shard per repeated block + root
    fsdp:8,reshard=false           keep the gathered parameters from forward to backward
    fsdp:8,param_dtype=bf16        MixedPrecisionPolicy(param_dtype=bf16), grads reduced in it
    fsdp:8,checkpoint=true         activation checkpointing of every block, as torchtitan does
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inspector.schema.options import OptionError

__all__ = ["STRATEGIES", "PlanSpec", "parse_plan", "MAX_WORLD_SIZE", "DEFAULT_BUCKET_MB"]

STRATEGIES = ("ddp", "zero1", "fsdp")
MAX_WORLD_SIZE = 65536
DEFAULT_BUCKET_MB = 25  # DistributedDataParallel(bucket_cap_mb=25)
_PARAM_DTYPES = {"float32": "float32", "fp32": "float32", "bf16": "bf16", "bfloat16": "bf16",
                 "fp16": "fp16", "float16": "fp16"}  # fmt: skip
_KEYS = {
    "ddp": ("bucket_mb",),
    "zero1": ("bucket_mb",),
    "fsdp": ("reshard", "param_dtype", "checkpoint"),
}


@dataclass(frozen=True)
class PlanSpec:
    strategy: str  # one of STRATEGIES
    world_size: int
    options: dict[str, str | int | bool] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The normal form: `fsdp:8,param_dtype=bf16,reshard=false`."""
        extra = "".join(f",{k}={_show(v)}" for k, v in sorted(self.options.items()))
        return f"{self.strategy}:{self.world_size}{extra}"

    def with_world_size(self, n: int) -> PlanSpec:
        return PlanSpec(self.strategy, n, dict(self.options))


def _show(value: str | int | bool) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_plan(text: str) -> PlanSpec:
    """`fsdp:8,reshard=false` -> PlanSpec; OptionError with an example otherwise."""
    head, *pairs = [part.strip() for part in text.strip().split(",")]
    strategy, sep, size = head.partition(":")
    strategy = strategy.lower()
    if strategy not in STRATEGIES or not sep:
        raise OptionError(
            f"parallel plan {text!r}: write STRATEGY:N with STRATEGY one of "
            f"{', '.join(STRATEGIES)}, e.g. fsdp:8 or ddp:4,bucket_mb=50"
        )
    if not size.isdigit() or not 1 <= int(size) <= MAX_WORLD_SIZE:
        raise OptionError(
            f"parallel plan {text!r}: N must be a whole number of ranks, 1 to {MAX_WORLD_SIZE}"
        )
    options = dict(_option(strategy, pair, text) for pair in pairs if pair)
    return PlanSpec(strategy, int(size), options)


def _option(strategy: str, pair: str, text: str) -> tuple[str, str | int | bool]:
    key, _, value = (s.strip().lower() for s in pair.partition("="))
    if key not in _KEYS[strategy]:
        raise OptionError(
            f"parallel plan {text!r}: {strategy} takes {', '.join(_KEYS[strategy])}, not {key!r}"
        )
    if key in ("reshard", "checkpoint") and value in ("true", "false"):
        return key, value == "true"
    if key == "param_dtype" and value in _PARAM_DTYPES:
        return key, _PARAM_DTYPES[value]
    if key == "bucket_mb" and value.isdigit() and int(value) > 0:
        return key, int(value)
    expected = {"reshard": "true or false", "checkpoint": "true or false",
                "param_dtype": "bf16, fp16 or float32",
                "bucket_mb": "a whole number of MB"}[key]  # fmt: skip
    raise OptionError(f"parallel plan {text!r}: {key} must be {expected}, not {value!r}")
