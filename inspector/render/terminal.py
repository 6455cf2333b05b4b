"""The terminal view of a Report: header, module tree table, summary, findings.

Reads the Report only (compute, then display). User-provided names go through
`rich.text.Text`, never through rich markup, so a module called `[bold]` prints as is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from inspector.render.distributed import distributed_section
from inspector.render.fitplan import fit_section
from inspector.render.format import (
    budget_label,
    failed_attempts,
    format_batch,
    format_flops,
    format_shapes,
)
from inspector.report import Finding, Memory, Module, Report
from inspector.schema.figures import FIGURES
from inspector.schema.findings import SEVERITIES
from inspector.units import format_bytes, format_count

__all__ = ["render_terminal", "visible_modules", "AUTO_DEPTH", "BIG_TREE"]

# A tree with more modules than this is folded to AUTO_DEPTH unless --depth is given.
BIG_TREE = 80
AUTO_DEPTH = 3
FINDINGS_PER_SEVERITY = 20
ADVICE_SHOWN = 5
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def render_terminal(
    report: Report, *, depth: int | None = None, console: Console | None = None
) -> None:
    """Print `report` to `console` (stdout by default). `depth` limits the module tree:
    rows deeper than it are folded into their ancestor (None: all, or AUTO_DEPTH when big)."""
    console = console or Console()
    console.print(_header(report))
    if report.status == "failed":
        _print_failure(report, console)
        return
    _print_module_table(report, depth, console)
    sections = (_summary, _memory, _advice, _setups, fit_section, distributed_section, _serving,
                _gradients, _compile, _export)  # fmt: skip
    for section in sections:
        grid = section(report)
        if grid is not None:
            console.print(grid)
    _print_findings(report.findings, console)


# -- header -----------------------------------------------------------------------------


def _header(report: Report) -> Text:
    meta = report.meta
    text = Text()
    text.append(f"Model Graph Inspector {meta.inspector_version}".rstrip(), style="bold")
    name = meta.source_name or meta.entrypoint or "(unnamed model)"
    text.append(" · ").append(name, style="bold cyan")
    if meta.source_kind:
        text.append(f" ({meta.source_kind})")
    device = meta.device + (f" ({meta.device_name})" if meta.device_name else "")
    text.append(f"\ndevice {device} · ")
    text.append("fake tensors (no weights allocated)" if meta.fake else "real tensors")
    if meta.torch_version:
        text.append(f" · torch {meta.torch_version}")
    _append_input(text, meta.input_spec, meta.dims)
    _append_capture(text, report)
    for warning in meta.warnings:
        text.append(f"\nwarning: {warning}", style="yellow")
    return text


def _append_input(text: Text, spec: object, dims: dict[str, int]) -> None:
    if spec is None and not dims:
        return
    shown = spec if isinstance(spec, str) else json.dumps(spec, separators=(", ", ": "))
    if len(shown) > 120:
        shown = shown[:117] + "..."
    text.append(f"\ninput {shown}")
    if dims:
        text.append(" · dims " + ", ".join(f"{k}={v}" for k, v in dims.items()))


def _append_capture(text: Text, report: Report) -> None:
    capture = report.capture
    if capture.method is None and not capture.attempts:
        return
    text.append(f"\ncapture {capture.method or 'none'}")
    if capture.node_count:
        text.append(f" · {capture.node_count:,} nodes")
    for failure in failed_attempts(report):
        text.append(f"\n  failed {failure}", style="dim")
    for attempt in capture.attempts:  # how a capture that worked got round a failure
        if attempt.ok and attempt.error:
            note = attempt.error if len(attempt.error) <= 240 else attempt.error[:240] + " ..."
            text.append(f"\n  {attempt.method}: {note}", style="dim")


def _print_failure(report: Report, console: Console) -> None:
    error = report.error
    if error is None:
        console.print(Text("failed (no error recorded)", style="bold red"))
        return
    stage = f" during {error.stage}" if error.stage else ""
    console.print(Text(f"failed ({error.kind}{stage}): {error.message}", style="bold red"))
    if error.traceback:
        console.print(Text(error.traceback, style="dim"))


# -- module tree ------------------------------------------------------------------------


@dataclass
class TreeRow:
    module: Module
    level: int  # 0 for the root
    hidden: int = 0  # descendants folded into this row


def _level(path: str) -> int:
    return 0 if path == "" else path.count(".") + 1


def visible_modules(modules: Sequence[Module], depth: int | None) -> list[TreeRow]:
    """The rows to show, in the report's (pre-)order; each row counts its folded
    descendants. Measures are already aggregated over subtrees, so folding loses nothing."""
    rows = {m.path: TreeRow(m, _level(m.path)) for m in modules}
    if depth is None:
        return list(rows.values())
    for row in rows.values():
        if row.level > depth:
            ancestor = ".".join(row.module.path.split(".")[:depth])
            if ancestor in rows:
                rows[ancestor].hidden += 1
    return [row for row in rows.values() if row.level <= depth]


def _effective_depth(report: Report, depth: int | None) -> int | None:
    if depth is None and len(report.modules) > BIG_TREE:
        return AUTO_DEPTH
    return depth


def _print_module_table(report: Report, depth: int | None, console: Console) -> None:
    if not report.modules:
        return
    shown_depth = _effective_depth(report, depth)
    rows = visible_modules(report.modules, shown_depth)
    columns = _Columns.for_report(report)
    table = columns.table(footer=columns.totals(report))
    for row in rows:
        table.add_row(*columns.cells(row))
    console.print(table)
    if len(rows) < len(report.modules):
        console.print(
            Text(
                f"showing {len(rows):,} of {len(report.modules):,} modules (depth <= "
                f"{shown_depth}); use --depth N to see deeper, --depth all for every module",
                style="dim",
            )
        )


@dataclass
class _Columns:
    """Which optional columns this report has data for."""

    trainable: bool
    saved: bool
    grad: bool

    @classmethod
    def for_report(cls, report: Report) -> _Columns:
        modules = report.modules
        return cls(
            trainable=report.totals.frozen_params > 0,
            saved=any(m.saved_activation_bytes is not None for m in modules),
            grad=any(m.grad_norm is not None for m in modules),
        )

    def table(self, footer: list[Text]) -> Table:
        """The empty table; `footer` (the totals) sits under a rule at the bottom."""
        table = Table(box=box.SIMPLE, pad_edge=False, show_edge=False, show_footer=True)
        headers = ["Module", "Type", "Output shape", "Params"]
        headers += ["Trainable"] * self.trainable + ["FLOPs", "Output"]
        headers += ["Saved for bwd"] * self.saved + ["Grad norm"] * self.grad
        for i, (header, total) in enumerate(zip(headers, footer, strict=True)):
            justify = "left" if i < 3 else "right"
            table.add_column(header, footer=total, justify=justify, no_wrap=i == 0)
        return table

    def cells(self, row: TreeRow) -> list[Text]:
        m = row.module
        name = Text("  " * row.level + (m.path.rsplit(".", 1)[-1] if m.path else "(model)"))
        if row.hidden:
            name.append(f" (+{row.hidden})", style="dim")
        values = [m.params, m.trainable_params, m.flops_forward, m.output_bytes]
        return self._assemble(
            [name, Text(m.type), Text(format_shapes(m.output_shapes, limit=2))],
            values,
            m.saved_activation_bytes,
            _format_norm(m.grad_norm),
        )

    def totals(self, report: Report) -> list[Text]:
        t = report.totals
        values = [t.params, t.trainable_params, t.flops_forward, t.output_bytes]
        saved = report.memory.saved_activation_bytes
        return self._assemble([Text("Total"), Text(""), Text("")], values, saved, "", zero="0")

    def _assemble(
        self, head: list[Text], values: list[int], saved: int | None, grad: str, zero: str = "-"
    ) -> list[Text]:
        params, trainable, flops, output = values
        cells = head + [Text(format_count(params) if params else zero)]
        if self.trainable:
            cells.append(Text(format_count(trainable) if trainable else zero))
        cells.append(Text(format_flops(flops) if flops else zero))
        cells.append(Text(format_bytes(output) if output else zero))
        if self.saved:
            cells.append(Text(format_bytes(saved)))
        if self.grad:
            cells.append(Text(grad))
        return cells


def _format_norm(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


# -- summary sections -------------------------------------------------------------------


def _grid(title: str, lines: Iterable[tuple[str, str | Text]]) -> Group | None:
    """A titled two-column block of label / value lines; None when there are none."""
    lines = list(lines)
    if not lines:
        return None
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    for label, value in lines:
        grid.add_row(Text(label), value if isinstance(value, Text) else Text(value))
    return Group(Text(f"\n{title}", style="bold"), grid)


def _label(key: str) -> str:
    return FIGURES[key].label


def _summary(report: Report) -> Group | None:
    t = report.totals
    if not (t.params or t.flops_forward or report.modules):
        return None
    params = f"{format_count(t.params)} ({t.params:,})"
    lines = [
        (_label("params"), params),
        (_label("trainable_params"), format_count(t.trainable_params)),
    ]
    if t.frozen_params:
        lines.append(("Frozen", format_count(t.frozen_params)))
    if t.tied_params:
        lines.append(("Tied (counted once)", format_count(t.tied_params)))
    by_dtype = ", ".join(f"{k} {format_bytes(v)}" for k, v in t.param_bytes_by_dtype.items())
    lines.append((_label("param_bytes"), by_dtype or format_bytes(t.param_bytes)))
    if t.buffers:
        lines.append(("Buffers", f"{format_count(t.buffers)} ({format_bytes(t.buffer_bytes)})"))
    lines.append((_label("flops_forward"), format_flops(t.flops_forward)))
    if t.flops_backward:
        lines.append((_label("flops_backward"), format_flops(t.flops_backward)))
    return _grid("Summary", lines)


def _memory(report: Report) -> Group | None:
    m = report.memory
    lines: list[tuple[str, str | Text]] = []
    if m.optimizer:
        dtypes = [f"{what} {dtype}" for what, dtype in _dtypes(m) if dtype]
        lines.append(("Optimizer", m.optimizer + (f" ({', '.join(dtypes)})" if dtypes else "")))
    for key in ("param_bytes", "grad_bytes", "optimizer_bytes", "saved_activation_bytes"):
        value = getattr(m, key)
        if value is not None:
            lines.append((_label(key), format_bytes(value)))
    lines += _peak_lines(report)
    if not lines:
        return None
    lines += _max_batch_lines(report)
    lines += _block_lines(report.memory)
    return _grid("Memory", lines)


def _block_lines(m: Memory) -> list[tuple[str, str]]:
    """Only when the user named them: the model's own blocks are what people expect."""
    if not m.named_blocks:
        return []
    span = m.blocks[0] + (f" ... {m.blocks[-1]}" if len(m.blocks) > 1 else "")
    return [("Blocks", f"{len(m.blocks)} named by {', '.join(m.named_blocks)}: {span}")]


def _dtypes(m: Memory) -> list[tuple[str, str | None]]:
    return [("params", m.param_dtype), ("activations", m.activation_dtype)]


def _peak_lines(report: Report) -> list[tuple[str, str]]:
    m = report.memory
    lines = []
    if m.forward_peak_bytes is not None:
        where = f" at {m.forward_peak_node}" if m.forward_peak_node else ""
        lines.append((_label("forward_peak_bytes"), format_bytes(m.forward_peak_bytes) + where))
    if m.train_peak_bytes is not None:
        where = f" at {m.train_peak_node}" if m.train_peak_node else ""
        phase = f" ({m.train_peak_phase})" if m.train_peak_phase else ""
        peak = format_bytes(m.train_peak_bytes) + where + phase
        lines.append((_label("train_peak_bytes"), peak))
    measured = m.measured
    if measured is not None and measured.train_peak_bytes is not None:
        text = f"{format_bytes(measured.train_peak_bytes)} ({measured.method}, {measured.device})"
        if measured.train_peak_error is not None:
            text += f", estimate off by {measured.train_peak_error * 100:+.1f}%"
        lines.append(("Measured peak", text))
    return lines


def _max_batch_lines(report: Report) -> list[tuple[str, str]]:
    m = report.memory
    if not m.max_batch:
        return []
    budgets = sorted(m.max_batch.items(), key=lambda kv: int(kv[0]))
    text = " · ".join(f"{budget_label(b)}: {format_batch(n)}" for b, n in budgets)
    dim = f" (batch = {m.batch_dim})" if m.batch_dim else ""
    return [("Largest batch", text + dim)]


def _setups(report: Report) -> Group | None:
    """The same model under other optimizers, dtypes and checkpointing, lowest peak last."""
    rows = report.memory.setups
    if not rows:
        return None
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("Optimizer", "Activations", "Checkpointing", "Optimizer state", "Saved", "Peak"):
        table.add_column(
            name, justify="right" if name in ("Optimizer state", "Saved", "Peak") else "left"
        )
    for row in sorted(rows, key=lambda r: -r.train_peak_bytes):
        style = "bold" if row.measured else None
        table.add_row(
            row.optimizer + (" (run)" if row.measured else ""),
            row.activation_dtype,
            "every block" if row.checkpointing else "-",
            format_bytes(row.optimizer_bytes),
            format_bytes(row.saved_activation_bytes),
            format_bytes(row.train_peak_bytes),
            style=style,
        )
    return Group(Text("\nTraining set-ups (same model and batch)", style="bold"), table)


def _serving(report: Report) -> Group | None:
    """Serving memory: weights, the cache per token and per sequence, the peaks, and how
    many sequences fit each budget (the table: one row per context)."""
    s = report.serving
    if not s.computed:
        return _grid("Serving", [("Not measured", s.reason)]) if s.reason else None
    weights = f"{format_bytes(s.weights_bytes)} (int8 {format_bytes(s.weights_int8_bytes)}"
    kinds = sorted({layer.kind for layer in s.layers})
    lines = [
        ("Weights", weights + f", int4 {format_bytes(s.weights_int4_bytes)})"),
        (_label("kv_bytes_per_token"), f"{format_bytes(s.kv_bytes_per_token)} "
         f"({len(s.layers)} layers: {', '.join(kinds)})"),
        ("Cache per sequence", f"{format_bytes(s.cache_bytes_per_sequence)} at {s.context:,} "
         "tokens" + (f" + {format_bytes(s.cache_fixed_bytes)} state" if s.cache_fixed_bytes
                     else "")),
        (_label("prefill_peak_bytes"), f"{format_bytes(s.prefill_peak_bytes)} at "
         f"[{s.batch}, {s.context:,}]"),
        ("Decode peak", f"{format_bytes(s.decode_peak_bytes)} (one step of {s.batch} "
         f"sequence{'s' if s.batch != 1 else ''})"),
    ]  # fmt: skip
    lines += [("", note) for note in s.notes]
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    budgets = sorted({int(b) for row in s.table for b in row.max_concurrent_sequences})
    for name in ("Context", "Cache / sequence", *(budget_label(b) for b in budgets)):
        table.add_column(name, justify="right")
    for row in s.table:
        fits = [f"{row.max_concurrent_sequences.get(str(b), 0):,}" for b in budgets]
        table.add_row(f"{row.context:,}", format_bytes(row.cache_bytes_per_sequence), *fits)
    title = Text("\nSequences that fit (prefill one at a time, decode together)", style="bold")
    return Group(_grid("Serving", lines), title, table)


def _advice(report: Report) -> Group | None:
    """Memory advice, biggest saving first."""
    advice = sorted(report.memory.advice, key=lambda a: -a.saving_bytes)
    lines = [(f"-{format_bytes(a.saving_bytes)}", a.message) for a in advice[:ADVICE_SHOWN]]
    if len(advice) > ADVICE_SHOWN:
        lines.append(("", f"and {len(advice) - ADVICE_SHOWN} more (see --json)"))
    return _grid("Memory advice", lines)


def _gradients(report: Report) -> Group | None:
    g = report.gradients
    if not g.computed and not g.error:
        return None
    lines: list[tuple[str, str | Text]] = []
    if g.error:
        lines.append(("Error", Text(g.error, style="red")))
    if g.loss:
        value = f" = {g.loss_value:.4g}" if g.loss_value is not None else ""
        lines.append(("Loss", g.loss + value))
    bad = [p for p in g.params if p.verdict not in ("ok", "frozen")]
    lines.append(("Parameters", f"{len(g.params) - len(bad):,} ok, {len(bad):,} flagged"))
    for p in bad[:10]:
        lines.append((f"  {p.verdict}", f"{p.name} (grad norm {_format_norm(p.grad_norm)})"))
    if len(bad) > 10:
        lines.append(("", f"and {len(bad) - 10:,} more"))
    if g.first_nan_node:
        lines.append(("First NaN at", g.first_nan_node))
    return _grid("Gradients", lines)


BREAKS_SHOWN = 10


def _compile(report: Report) -> Group | None:
    c = report.compile
    if c.skipped:
        return _grid("torch.compile", [("Not checked", Text(c.skipped, style="dim"))])
    if not c.computed and not c.error:
        return None
    lines: list[tuple[str, str | Text]] = []
    if c.computed:
        graphs = "?" if c.graph_count is None else f"{c.graph_count:,}"
        style = "yellow" if c.graph_break_count else "green"
        count = f"{graphs} graph(s), {c.graph_break_count or 0:,} graph break(s)"
        lines.append(("Dynamo", Text(f"{count} ({c.backend} backend, {c.mode} mode)", style)))
    for item in c.breaks[:BREAKS_SHOWN]:
        times = f" ×{item.count}" if item.count > 1 else ""
        code = f"  {item.code}" if item.code else ""
        lines.append((f"  {item.where or 'break'}{times}", f"{item.reason}{code}"))
    if len(c.breaks) > BREAKS_SHOWN:
        lines.append(("", f"and {len(c.breaks) - BREAKS_SHOWN:,} more (see --json)"))
    for note in c.notes:
        lines.append(("Dynamo says", Text(note, style="dim")))
    for r in c.recompiles:
        what = r.error or (r.guards[0] if r.guards else "no guard failed")
        change = f"{r.dim} {r.value} → {r.changed_to}"
        n = str(r.recompiles) if r.counted or not r.recompiles else "≥1"  # --compile fast
        lines.append((change, f"{n} recompile(s): {what}"))
    if c.error:
        lines.append(("Error", Text(c.error, style="red")))
    return _grid("torch.compile", lines)


def _export(report: Report) -> Group | None:
    lines: list[tuple[str, str | Text]] = []
    for target in report.export.targets:
        if target.ok is None:
            lines.append((target.target, Text("not attempted", style="dim")))
        elif target.ok:
            lines.append((target.target, Text("ok", style="green")))
        else:
            where = f" at {target.location}" if target.location else ""
            first = (target.error or "").strip().splitlines()[:1]
            lines.append((target.target, Text(f"fails{where}: {''.join(first)}", style="red")))
    if lines and all(t.target != "export-strict" for t in report.export.targets):
        note = "strict export, TorchScript and ONNX: with --export all"
        lines.append(("others", Text(note, style="dim")))
    return _grid("Export readiness", lines)


def _print_findings(findings: Sequence[Finding], console: Console) -> None:
    if not findings:
        return
    console.print(Text("\nFindings", style="bold"))
    for severity in SEVERITIES:
        group = [f for f in findings if f.severity == severity]
        for finding in group[:FINDINGS_PER_SEVERITY]:
            console.print(_finding_text(finding))
        if len(group) > FINDINGS_PER_SEVERITY:
            more = len(group) - FINDINGS_PER_SEVERITY
            console.print(Text(f"  and {more:,} more {severity}s (see --json)", style="dim"))


def _finding_text(finding: Finding) -> Text:
    text = Text("  ")
    text.append(f"{finding.severity:<7}", style=SEVERITY_STYLE.get(finding.severity, ""))
    text.append(f" {finding.rule}", style="bold")
    if finding.where:
        text.append(f" at {finding.where}")
    text.append(f": {finding.message}")
    if finding.fix:
        text.append(f"\n          fix: {finding.fix}", style="green")
    return text
