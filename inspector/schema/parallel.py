"""The `--parallel STRATEGY:N[,key=value...]` grammar, torch-free: the CLI, the upload
form and the API read a plan spec the same way.

    ddp:4                          DistributedDataParallel on 4 ranks (bucket_cap_mb=25)
    ddp:4,bucket_mb=50             larger gradient buckets
    zero1:4                        DDP + ZeroRedundancyOptimizer: optimizer state sharded
    zero2:4                        ... and gradients, reduce-scattered as autograd makes them
    fsdp:8                         FSDP2: fully_shard per repeated block + root
    fsdp:8,reshard=false           keep the gathered parameters from forward to backward
    fsdp:8,param_dtype=bf16        MixedPrecisionPolicy(param_dtype=bf16), grads reduced in it
    fsdp:8,checkpoint=true         activation checkpointing of every block, as torchtitan does
    fsdp:8,offload=true            CPUOffloadPolicy: shards, grads, optimizer state on the host
    tp:8                           tensor parallel: parallelize_module, Colwise/Rowwise Linear
    tp:8,sp                        ... and sequence parallel norms (sharded on the sequence)
    fsdp:8+tp:8                    2-D: TP inside groups of 8, FSDP across 8 groups (64 ranks)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inspector.schema.options import OptionError

__all__ = ["STRATEGIES", "PlanSpec", "parse_plan", "MAX_WORLD_SIZE", "DEFAULT_BUCKET_MB"]

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "tp", "fsdp+tp")
MAX_WORLD_SIZE = 65536
DEFAULT_BUCKET_MB = 25  # DistributedDataParallel(bucket_cap_mb=25)
_PARAM_DTYPES = {"float32": "float32", "fp32": "float32", "bf16": "bf16", "bfloat16": "bf16",
                 "fp16": "fp16", "float16": "fp16"}  # fmt: skip
_KEYS = {
    "ddp": ("bucket_mb",),
    "zero1": ("bucket_mb",),
    "zero2": (),
    "fsdp": ("reshard", "param_dtype", "checkpoint", "offload"),
    "tp": ("sp", "checkpoint"),
}
_FLAGS = ("reshard", "checkpoint", "offload", "sp")  # true/false options; a bare `sp` means sp=true
_TP_KEYS = ("sp",)  # the 2-D plan's options written after its `+tp:N` part


@dataclass(frozen=True)
class PlanSpec:
    strategy: str  # one of STRATEGIES
    world_size: int  # all ranks; a 2-D plan's is its FSDP degree times its TP degree
    options: dict[str, str | int | bool] = field(default_factory=dict)
    tp_size: int = 1  # the TP degree: `tp:N`'s N, the `+tp:N` of a 2-D plan

    @property
    def dp_size(self) -> int:
        """Ranks the batch is split over (the data-parallel degree)."""
        return self.world_size // self.tp_size if self.strategy != "tp" else 1

    @property
    def text(self) -> str:
        """The normal form: `fsdp:8,param_dtype=bf16,reshard=false`, `fsdp:8+tp:8,sp`."""
        if self.strategy == "fsdp+tp":
            return f"fsdp:{self.dp_size}{self._extra(False)}+tp:{self.tp_size}{self._extra(True)}"
        return f"{self.strategy}:{self.world_size}{self._extra(None)}"

    @property
    def family(self) -> str:
        """The plan without the degree that the fewest-GPUs search varies: `fsdp,checkpoint=
        true`, `tp,sp`, `fsdp+tp:8` (2-D: the TP degree is kept, FSDP's varies)."""
        if self.strategy == "fsdp+tp":
            return f"fsdp{self._extra(False)}+tp:{self.tp_size}{self._extra(True)}"
        return f"{self.strategy}{self._extra(None)}"

    def _extra(self, tp_part: bool | None) -> str:
        keys = sorted(k for k in self.options if tp_part is None or (k in _TP_KEYS) == tp_part)
        return "".join(_pair(k, self.options[k]) for k in keys)

    def with_world_size(self, n: int) -> PlanSpec:
        """The same plan on `n` ranks (a 2-D plan keeps its TP degree: n is a multiple)."""
        tp = n if self.strategy == "tp" else self.tp_size
        if n % tp:
            raise ValueError(f"{self.text}: {n} ranks are not groups of {tp} TP ranks")
        return PlanSpec(self.strategy, n, dict(self.options), tp)


def _pair(key: str, value: str | int | bool) -> str:
    if key == "sp":
        return ",sp" if value else ""
    return f",{key}={str(value).lower() if isinstance(value, bool) else value}"


def parse_plan(text: str) -> PlanSpec:
    """`fsdp:8,reshard=false` or `fsdp:8+tp:8,sp` -> PlanSpec; OptionError with an example
    otherwise."""
    parts = [_one(part, text) for part in text.split("+")]
    if len(parts) == 1:
        return parts[0]
    if [p.strategy for p in parts] != ["fsdp", "tp"]:
        raise OptionError(
            f"parallel plan {text!r}: the only 2-D plan is FSDP across TP groups, "
            "written fsdp:N+tp:M (e.g. fsdp:8+tp:8 on 64 ranks)"
        )
    fsdp, tp = parts
    if fsdp.world_size * tp.world_size > MAX_WORLD_SIZE:
        raise OptionError(f"parallel plan {text!r}: more than {MAX_WORLD_SIZE} ranks")
    options = {**fsdp.options, **tp.options}
    return PlanSpec("fsdp+tp", fsdp.world_size * tp.world_size, options, tp.world_size)


def _one(part: str, text: str) -> PlanSpec:
    head, *pairs = [p.strip() for p in part.strip().split(",")]
    strategy, sep, size = head.partition(":")
    strategy = strategy.lower()
    if strategy not in _KEYS or not sep:
        raise OptionError(
            f"parallel plan {text!r}: write STRATEGY:N with STRATEGY one of "
            f"{', '.join(_KEYS)}, or fsdp:N+tp:M; e.g. fsdp:8, ddp:4,bucket_mb=50 or tp:8,sp"
        )
    if not size.isdigit() or not 1 <= int(size) <= MAX_WORLD_SIZE:
        raise OptionError(
            f"parallel plan {text!r}: N must be a whole number of ranks, 1 to {MAX_WORLD_SIZE}"
        )
    options = dict(_option(strategy, pair, text) for pair in pairs if pair)
    n = int(size)
    return PlanSpec(strategy, n, options, n if strategy == "tp" else 1)


def _option(strategy: str, pair: str, text: str) -> tuple[str, str | int | bool]:
    key, eq, value = (s.strip().lower() for s in pair.partition("="))
    if key not in _KEYS[strategy]:
        raise OptionError(
            f"parallel plan {text!r}: {strategy} takes {', '.join(_KEYS[strategy])}, not {key!r}"
        )
    if key == "sp" and not eq:
        return key, True
    if key in _FLAGS and value in ("true", "false"):
        return key, value == "true"
    if key == "param_dtype" and value in _PARAM_DTYPES:
        return key, _PARAM_DTYPES[value]
    if key == "bucket_mb" and value.isdigit() and int(value) > 0:
        return key, int(value)
    expected = {"reshard": "true or false", "checkpoint": "true or false",
                "offload": "true or false",
                "sp": "true or false (or just `sp`)", "param_dtype": "bf16, fp16 or float32",
                "bucket_mb": "a whole number of MB"}[key]  # fmt: skip
    raise OptionError(f"parallel plan {text!r}: {key} must be {expected}, not {value!r}")
