"""Form fields of an upload besides the files: name, tags and analysis options."""

from __future__ import annotations

from typing import Any

from inspector.schema.options import (
    DEFAULT_COMPILE,
    DEFAULT_EXPORT,
    DEFAULT_SERVING,
    OptionError,
    autocast_dtype,
    block_patterns,
    compile_level,
    device_choice,
    export_level,
    fit_batch,
    fit_budget,
    optimizer_choice,
    serving_choice,
)
from inspector.schema.parallel import parse_plan
from inspector.units import parse_size
from server.api.errors import ApiError

__all__ = ["parse_tags", "parse_options", "parse_name"]

MAX_TAGS = 50


def _invalid(message: str) -> ApiError:
    return ApiError(422, "invalid", message)


def parse_tags(values: list[str]) -> dict[str, str]:
    """`key=value` items, comma-separated and/or repeated; a key may appear once."""
    tags: dict[str, str] = {}
    items = [p.strip() for v in values for p in v.split(",") if p.strip()]
    for item in items:
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not key:
            raise _invalid(f"tag {item!r}: write tags as key=value, e.g. branch=main")
        if len(key) > 64 or len(value) > 256:
            raise _invalid(f"tag {item!r}: keys are at most 64 characters, values 256")
        if key in tags and tags[key] != value:
            raise _invalid(f"tag {key!r} is given twice ({tags[key]!r} and {value!r})")
        tags[key] = value
    if len(tags) > MAX_TAGS:
        raise _invalid(f"{len(tags)} tags; at most {MAX_TAGS}")
    return tags


def parse_name(name: str | None, default: str) -> str:
    text = " ".join((name or "").split()) or default
    if len(text) > 200:
        raise _invalid("name: at most 200 characters")
    return text


def parse_options(
    *,
    optimizer: str,
    dtype: str,
    device: str | None,
    fake: bool,
    budget: str | None,
    default_device: str,
    export: str = DEFAULT_EXPORT,
    serving: str = DEFAULT_SERVING,
    compile: str = DEFAULT_COMPILE,
    parallel: list[str] | None = None,
    fit: str | None = None,
    fit_batch: str | None = None,
    blocks: str | None = None,
) -> dict[str, Any]:
    """The options the job child hands to `inspector.analyze` (names of `Options` fields)."""
    try:
        chosen: dict[str, Any] = {
            "optimizer": optimizer_choice(optimizer),
            "dtype": autocast_dtype(dtype),
            "device": device_choice(device or default_device),
            "export": export_level(export),
            "compile": compile_level(compile),
            "serving": serving_choice(serving),
        }
        plans = _plans(parallel or [])
        chosen.update(_fit(fit, fit_batch))
        if blocks and blocks.strip():  # absent when none, as for plans
            chosen["blocks"] = block_patterns(blocks)
    except OptionError as exc:
        raise _invalid(str(exc)) from None
    if plans:  # absent when none: the options of uploads without plans stay as they were
        chosen["parallel"] = plans
    return {**chosen, "fake": fake, "budgets_bytes": _budgets(budget)}


def _plans(fields: list[str]) -> list[str]:
    """`--parallel` plans in their normal form; a field may hold several, `;`-separated
    (a plan's own options are comma-separated)."""
    texts = [t for field in fields for t in field.replace("\n", ";").split(";") if t.strip()]
    return [parse_plan(t).text for t in texts]


def _fit(budget: str | None, batch: str | None) -> dict[str, int]:
    """`fit_bytes` and `fit_batch` when a fit budget is given (absent otherwise, as for
    plans); a batch without a budget is refused."""
    budget, batch = (budget or "").strip(), (batch or "").strip()
    if not budget:
        if batch:
            raise OptionError("fit_batch is the effective batch of a fit plan: give fit too")
        return {}
    out = {"fit_bytes": fit_budget(budget)}
    if batch:
        out["fit_batch"] = fit_batch(batch)
    return out


def _budgets(text: str | None) -> list[int]:
    budgets = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        try:
            size = parse_size(part)
        except ValueError as exc:
            raise _invalid(f"budget: {exc}") from exc
        if size <= 0:
            raise _invalid(f"budget {part.strip()!r} must be positive")
        budgets.append(size)
    return budgets
