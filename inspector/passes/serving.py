"""Serving pass: the model's cache per token, the prefill and decode peaks, and how many
sequences fit each accelerator, measured with the model's own cache on fake tensors.

On when asked (`--serving`), and by default for presets and Hugging Face configs whose
`forward` takes a cache (decoder language models). Needs a named sequence dim `S` in the
input (presets have it) so the context can be changed.
"""

from __future__ import annotations

from typing import Any

from inspector.context import Context, Inputs
from inspector.memory.shadow import fake_shadow, new_fake_mode
from inspector.report import Serving, ServingLayer, ServingRow
from inspector.serving.cache import CACHE_PARAMS, cache_param
from inspector.serving.plan import DecodeLine, max_sequences, weight_bytes
from inspector.serving.run import StepMemory, decode, prefill, serving_kwargs, token_ids
from inspector.units import ACCELERATOR_BUDGETS

__all__ = ["run", "wanted", "SEQUENCE_DIM", "TABLE_CONTEXTS"]

SEQUENCE_DIM = "S"
TABLE_CONTEXTS = (4096, 8192, 32768)
MAX_TABLE_OPS = 200_000  # a fake prefill past this many ops is left out of the table
_CHECK_SEQUENCES = 4  # the decode line is checked against a measured step at this many
_AUTO_KINDS = ("preset", "hf-config")


def wanted(ctx: Context) -> bool:
    """`--serving` asked for it, or a preset / config of a model that takes a cache."""
    if ctx.options.serving is not None:
        return ctx.options.serving
    if ctx.loaded.generate_step is not None:  # the file says how it generates
        return True
    return ctx.loaded.source_kind in _AUTO_KINDS and cache_param(ctx.model) is not None


def run(ctx: Context) -> None:
    if not wanted(ctx):
        return
    section = ctx.report.serving
    why = _unsupported(ctx)
    if why:
        section.reason = why
        return
    try:
        _measure(ctx, section)
    except Exception as exc:  # a model that cannot step with its cache here: say why
        section.computed = False
        section.reason = f"the model did not run with its cache: {type(exc).__name__}: {exc}"


def _unsupported(ctx: Context) -> str | None:
    if cache_param(ctx.model) is None and ctx.loaded.generate_step is None:
        return (
            f"{type(ctx.model).__name__}.forward takes no cache argument "
            f"({', '.join(CACHE_PARAMS)}) and the file defines no "
            "generate_step(model, tokens, cache), so there is no generation step to measure."
        )
    if SEQUENCE_DIM not in ctx.factory.dims:
        return (
            f'the input has no sequence dim named "{SEQUENCE_DIM}": name it in the input spec, '
            'e.g. {"input_ids": {"shape": ["B", "S"], "dtype": "int64", "high": 50257}, '
            '"dims": {"B": 1, "S": 4096}}.'
        )
    limit, context = _max_positions(ctx.model), ctx.factory.dims[SEQUENCE_DIM]
    if limit is not None and context > limit:
        return (
            f"the context S={context:,} is longer than the {limit:,} positions "
            f"{type(ctx.model).__name__} can encode; give S <= {limit:,}."
        )
    return None


class _Runner:
    """The fake copy of the model and its inputs at any batch and context."""

    def __init__(self, ctx: Context) -> None:
        self.fake_mode = ctx.fake_mode or ctx.loaded.fake_mode or new_fake_mode()
        self.model = fake_shadow(ctx.model, self.fake_mode)
        self.factory, self.device = ctx.factory, ctx.options.device
        self.batch_dim = ctx.factory.batch_dim
        self.cache_name = cache_param(ctx.model)
        self.step = ctx.loaded.generate_step  # the model file's own generation step

    def inputs(self, batch: int, context: int) -> Inputs:
        dims = {SEQUENCE_DIM: context, **({self.batch_dim: batch} if self.batch_dim else {})}
        with self.fake_mode:
            return self.factory.build(dims, self.device)

    def prefill(self, batch: int, context: int) -> StepMemory:
        return prefill(self.model, self.inputs(batch, context), self.fake_mode, self.step)

    def decode(self, batch: int, context: int, cache: Any = None) -> StepMemory:
        """One step of `batch` sequences; `cache` (consumed) saves their prefill."""
        cache = cache if cache is not None else self.prefill(batch, context).cache
        tokens = token_ids(self.inputs(batch, 1))
        return decode(self.model, tokens, cache, self.cache_name, self.fake_mode, self.step)


def _measure(ctx: Context, section: Serving) -> None:
    r = _Runner(ctx)
    context = ctx.factory.dims[SEQUENCE_DIM]
    batch = ctx.factory.dims.get(r.batch_dim, 1) if r.batch_dim else 1
    weights = weight_bytes(r.model)
    section.batch, section.context = batch, context
    section.weights_bytes, section.weights_bytes_by_dtype = weights.stored, weights.by_dtype
    section.weights_int8_bytes, section.weights_int4_bytes = weights.int8, weights.int4
    one, at_1, at_2 = r.prefill(1, context), r.prefill(1, 1), r.prefill(1, 2)
    section.layers = _layers(at_1, at_2, one, context)
    section.kv_bytes_per_token = sum(layer.bytes_per_token for layer in section.layers)
    section.cache_fixed_bytes = sum(layer.fixed_bytes for layer in section.layers)
    section.cache_bytes_per_sequence = one.cache_bytes
    section.prefill_peak_bytes = (one if batch == 1 else r.prefill(batch, context)).peak_bytes
    # ops per token > 0: the model loops over tokens (from 2 tokens on: one token can
    # take a decode-like path of its own)
    per_token = (one.op_count - at_2.op_count) / max(context - 2, 1)
    table_steps, skipped = _table_steps(r, ctx, context, one, per_token)
    measured = {1: r.decode(1, context, one.cache).peak_bytes, 2: r.decode(2, context).peak_bytes}
    line = DecodeLine.through(measured[1], measured[2])
    section.decode_fixed_bytes = line.fixed_bytes
    section.decode_per_sequence_bytes = line.per_sequence_bytes
    section.decode_peak_bytes = measured.get(batch) or r.decode(batch, context).peak_bytes
    checked = r.decode(_CHECK_SEQUENCES, context).peak_bytes
    section.decode_check_error = round((line.at(_CHECK_SEQUENCES) - checked) / checked, 6)
    budgets = sorted(set(ACCELERATOR_BUDGETS) | set(ctx.options.budgets_bytes))
    section.max_concurrent_sequences = _fits(budgets, one, line)
    section.table = _table(table_steps, budgets, line, one)
    section.notes = _notes(r.model) + _skipped_note(skipped)
    section.computed = True


def _fits(budgets: list[int], one: StepMemory, line: DecodeLine) -> dict[str, int]:
    return {str(b): max_sequences(b, one.peak_bytes, one.cache_bytes, line) for b in budgets}


def _layers(
    at_1: StepMemory, at_2: StepMemory, at_s: StepMemory, context: int
) -> list[ServingLayer]:
    """Each cache layer's growth per token (from 1 to 2 tokens) and fixed part; a layer
    that holds less at the context than its growth predicts stops at a window."""
    rows = []
    for i, (a, b, s) in enumerate(zip(at_1.layers, at_2.layers, at_s.layers, strict=True)):
        per_token = b.nbytes - a.nbytes
        fixed = a.nbytes - per_token
        capped = None
        if per_token > 0 and s.nbytes < fixed + per_token * context:
            capped = (s.nbytes - fixed) // per_token
        rows.append(ServingLayer(index=i, kind=s.kind, bytes_per_token=per_token,
                                 fixed_bytes=fixed, capped_at_tokens=capped))  # fmt: skip
    return rows


def _table_steps(
    r: _Runner, ctx: Context, context: int, one: StepMemory, ops_per_token: float
) -> tuple[list[tuple[StepMemory, int]], list[int]]:
    """A prefill of one sequence at each table context the model's positions allow, and
    the contexts left out because the model runs an op sequence per token (Mamba's slow
    path) whose fake run would take too long there."""
    limit = _max_positions(ctx.model)
    steps, skipped = [], []
    for c in sorted({context, *TABLE_CONTEXTS}):
        if limit is not None and c > limit:
            continue
        if c != context and one.op_count + ops_per_token * (c - context) > MAX_TABLE_OPS:
            skipped.append(c)
            continue
        steps.append((one if c == context else r.prefill(1, c), c))
    return steps, skipped


def _skipped_note(skipped: list[int]) -> list[str]:
    if not skipped:
        return []
    contexts = ", ".join(f"{c:,}" for c in skipped)
    return [f"contexts {contexts} not measured: the model runs its ops once per token there"]


def _table(
    steps: list[tuple[StepMemory, int]], budgets: list[int], line: DecodeLine, one: StepMemory
) -> list[ServingRow]:
    """Each context's cache and prefill peak as measured; the decode workspace per
    sequence (logits, activations) taken from the spec's context."""
    workspace = line.per_sequence_bytes - one.cache_bytes
    rows = []
    for step, c in steps:
        at_c = DecodeLine(line.fixed_bytes, step.cache_bytes + workspace)
        rows.append(ServingRow(context=c, cache_bytes_per_sequence=step.cache_bytes,
                               prefill_peak_bytes=step.peak_bytes,
                               max_concurrent_sequences=_fits(budgets, step, at_c)))  # fmt: skip
    return rows


def _max_positions(model: Any) -> int | None:
    config = getattr(model, "config", None)
    value = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return int(value) if isinstance(value, int) else None


def _notes(model: Any) -> list[str]:
    notes = ["measured with the model's own cache on fake tensors (nothing allocated)"]
    if "logits_to_keep" in serving_kwargs(model):
        notes.append("the prefill computes the next token's logits only, as serving engines do")
    return notes
