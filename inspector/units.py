"""Human units: bytes and counts for display, and sizes parsed from the command line."""

from __future__ import annotations

import re

__all__ = ["format_bytes", "format_count", "format_flops", "parse_size", "ACCELERATOR_BUDGETS"]

_BINARY = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgtp]?)(i?)(b?)\s*$", re.I)

# The common accelerator memory sizes, in bytes (16, 24, 40, 48, 80, 141 GiB).
ACCELERATOR_BUDGETS = [g * 1024**3 for g in (16, 24, 40, 48, 80, 141)]


def parse_size(text: str | int | float) -> int:
    """Parse '20GiB', '16GB', '512MiB', '1e9' or a plain number of bytes."""
    if isinstance(text, int | float):
        return int(text)
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 20GiB, 16GB, 512MiB, 1e9)")
    number, prefix, binary, _ = match.groups()
    table = _BINARY if binary else _DECIMAL
    return int(float(number) * table[prefix.lower()])


def format_bytes(n: int | float | None) -> str:
    """1536 -> '1.50 KiB'; binary prefixes, as memory is allocated in them."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_count(n: int | float | None) -> str:
    """11689512 -> '11.69M'; decimal prefixes, as parameter counts are quoted."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("", "K", "M", "G", "T"):
        if n < 1000 or unit == "T":
            return f"{sign}{n:.0f}" if unit == "" else f"{sign}{n:.2f}{unit}"
        n /= 1000
    raise AssertionError("unreachable")


def format_flops(n: int | float | None) -> str:
    """4_110_000_000 -> '4.11 GFLOPs' (decimal prefixes, a multiply-add = 2 FLOPs)."""
    if n is None:
        return "-"
    text = format_count(n)
    if text[-1].isalpha():
        return f"{text[:-1]} {text[-1]}FLOPs"
    return f"{text} FLOPs"
