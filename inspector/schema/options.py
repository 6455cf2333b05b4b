"""The analysis options: choices, defaults and their normal forms.

`inspector.context.Options`, the CLI's flags, the upload form and the API, and
`inspector submit` all take their choices from here; each check raises `OptionError`
with one message, whichever front end the value came through.
"""

from __future__ import annotations

from inspector.units import parse_size

__all__ = [
    "OptionError",
    "OPTIMIZERS",
    "DEFAULT_OPTIMIZER",
    "AUTOCAST_DTYPES",
    "DEFAULT_DTYPE",
    "DEVICES",
    "DEFAULT_DEVICE",
    "EXPORT_LEVELS",
    "DEFAULT_EXPORT",
    "COMPILE_LEVELS",
    "DEFAULT_COMPILE",
    "optimizer_choice",
    "autocast_dtype",
    "device_choice",
    "export_level",
    "compile_level",
    "SERVING_CHOICES",
    "DEFAULT_SERVING",
    "serving_choice",
    "fit_budget",
    "fit_batch",
    "block_patterns",
]

# Optimizer state in the memory figures; "none" means forward and backward only.
OPTIMIZERS = ("none", "sgd", "momentum", "adam", "adamw")
DEFAULT_OPTIMIZER = "adamw"

# The activation dtype under autocast, by canonical name; the aliases people write.
AUTOCAST_DTYPES = ("float32", "bf16", "fp16")
DEFAULT_DTYPE = "float32"
_DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
}  # fmt: skip

DEVICES = ("auto", "cpu", "cuda")
DEFAULT_DEVICE = "auto"

# Export readiness: none; fast (non-strict torch.export, TorchScript); all (+ strict, ONNX).
EXPORT_LEVELS = ("none", "fast", "all")
DEFAULT_EXPORT = "fast"

# torch.compile readiness: none; fast (graph breaks on the sample, and per named dim the
# first guard that fails when it changes); all (+ every recompile counted, as many extra
# compiles as named dims).
COMPILE_LEVELS = ("none", "fast", "all")
DEFAULT_COMPILE = "fast"


# Serving memory: auto (on for presets and configs of decoder LMs), on, off.
SERVING_CHOICES = ("auto", "on", "off")
DEFAULT_SERVING = "auto"
_SERVING = {"auto": None, "on": True, "off": False}


class OptionError(ValueError):
    """An option value outside its choices; the message names the choices."""


def _choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    key = value.strip().lower()
    if key not in choices:
        raise OptionError(f"{name} {value!r}: use one of {', '.join(choices)}")
    return key


def optimizer_choice(value: str) -> str:
    return _choice("optimizer", value, OPTIMIZERS)


def device_choice(value: str) -> str:
    return _choice("device", value, DEVICES)


def export_level(value: str) -> str:
    return _choice("export", value, EXPORT_LEVELS)


def compile_level(value: str) -> str:
    return _choice("compile", value, COMPILE_LEVELS)


def serving_choice(value: str) -> bool | None:
    """'auto' -> None (the pass decides), 'on' -> True, 'off' -> False."""
    return _SERVING[_choice("serving", value, SERVING_CHOICES)]


def autocast_dtype(value: str) -> str:
    """'bfloat16' -> 'bf16': the canonical name of an autocast dtype."""
    key = value.strip().lower().removeprefix("torch.")
    if key not in _DTYPE_ALIASES:
        raise OptionError(f"dtype {value!r}: use one of {', '.join(AUTOCAST_DTYPES)}")
    return _DTYPE_ALIASES[key]


def fit_budget(value: str | int) -> int:
    """`--fit BUDGET`: '24GiB', '80GB' or bytes -> bytes, positive."""
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise OptionError(f"fit budget: {exc}") from None
    if size <= 0:
        raise OptionError(f"fit budget {value!r} must be positive, e.g. 24GiB or 80GB")
    return size


def fit_batch(value: str | int) -> int:
    """`--batch B`: the effective batch per optimizer step, a whole number >= 1."""
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        raise OptionError(
            f"fit batch {value!r}: the effective batch per optimizer step, a whole number "
            "of samples >= 1 (e.g. --batch 64)"
        )
    return int(text)


def block_patterns(value: str | list[str]) -> list[str]:
    """`--blocks 'LlamaDecoderLayer, layers.*'` -> ['LlamaDecoderLayer', 'layers.*']: module
    class names or globs over module paths (inspector.memory.namedblocks)."""
    items = value if isinstance(value, list) else [value]
    patterns = [p.strip() for item in items for p in str(item).split(",") if p.strip()]
    if not patterns:
        raise OptionError(
            "blocks: name module classes or path globs, e.g. LlamaDecoderLayer or layers.*"
        )
    bad = [p for p in patterns if len(p) > 200 or not p.isprintable()]
    if bad:
        raise OptionError(f"blocks {bad[0]!r}: a class name or a path glob, at most 200 characters")
    return patterns
