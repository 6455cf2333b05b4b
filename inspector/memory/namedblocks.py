"""The blocks a user names with `--blocks`: what checkpointing advice, the set-ups, the fit
plan, FSDP's `fully_shard` units and the tensor-parallel plan take as "the blocks" in place
of the ones `inspector.memory.advice.blocks` finds in the model's structure.

A pattern is a module class name (`LlamaDecoderLayer`, as FSDP's
`transformer_auto_wrap_policy` and torchtitan name them) or a glob over module paths
(`layers.*`, `encoder.layer.*`, `down.0`); `inspector.schema.options.block_patterns`
parses them. Blocks are the
outermost matching modules, in model order: a match inside a block is part of it.

The names are set for the length of one analysis (`named_blocks`). A module global, not a
context variable: passes run in forked children and in worker threads of this process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from fnmatch import fnmatchcase

from torch import nn

from inspector.errors import UserError

__all__ = ["named_blocks", "current_patterns", "match_blocks"]

_patterns: tuple[str, ...] = ()


def current_patterns() -> tuple[str, ...]:
    """The patterns of the analysis running now (empty: the model's own blocks)."""
    return _patterns


@contextmanager
def named_blocks(patterns: tuple[str, ...] | list[str]) -> Iterator[None]:
    """The blocks are the modules matching `patterns` while this lasts (empty: no change)."""
    global _patterns
    before, _patterns = _patterns, tuple(patterns)
    try:
        yield
    finally:
        _patterns = before


def _matches(pattern: str, path: str, module: nn.Module) -> bool:
    cls = type(module)
    if pattern in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}"):
        return True
    return fnmatchcase(path, pattern)


def match_blocks(model: nn.Module, patterns: tuple[str, ...]) -> list[tuple[str, str]]:
    """(path, type) of the outermost modules matching any pattern, in model order; a
    UserError naming what the model has when a pattern matches nothing."""
    out: list[tuple[str, str]] = []
    used: set[str] = set()
    for path, module in model.named_modules():
        if not path:
            continue  # the model itself is the root unit, never a block
        hits = [p for p in patterns if _matches(p, path, module)]
        used.update(hits)
        if hits and not any(path.startswith(b + ".") for b, _ in out):
            out.append((path, type(module).__name__))
    unused = [p for p in patterns if p not in used]
    if unused:
        raise UserError(
            f"--blocks {', '.join(unused)}: no module of the model matches",
            hint=f"Name a module class or a path glob. {_suggestion(model)}",
        )
    return out


def _suggestion(model: nn.Module) -> str:
    """The classes that repeat (what people usually mean), and a few paths."""
    counts = Counter(
        type(m).__name__ for p, m in model.named_modules() if p and next(m.children(), None)
    )
    repeated = [name for name, n in counts.most_common() if n >= 2][:5]
    paths = [p for p, _ in model.named_children()][:6]
    parts = []
    if repeated:
        parts.append(f"Repeated classes: {', '.join(repeated)}.")
    if paths:
        parts.append(f"Top-level modules: {', '.join(paths)}.")
    return " ".join(parts)
