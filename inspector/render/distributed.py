"""The terminal view of `report.distributed`: one row per plan, then the fewest GPUs of
each accelerator size per strategy. Reads the Report only."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from inspector.render.format import budget_label
from inspector.report import Distributed, Report
from inspector.units import format_bytes

__all__ = ["distributed_section"]

_PLAN_COLUMNS = ("Plan", "Heaviest rank peak", "Params", "Grads", "Optimizer", "Saved",
                 "Comm buffers", "Peak in")  # fmt: skip


def distributed_section(report: Report) -> Group | None:
    d = report.distributed
    if not d.plans:
        return None
    title = "\nDistributed training (per rank"
    title += f", batch {d.batch_per_rank} per rank)" if d.batch_per_rank else ")"
    parts: list[Text | Table] = [Text(title, style="bold"), _plans(d)]
    if d.gpus_needed:
        parts += [Text("\nFewest GPUs that fit (each run on fake tensors)", style="bold"), _gpus(d)]
    parts += [Text(f"{p.spec}: {note}", style="dim") for p in d.plans for note in p.notes]
    parts += [Text(note, style="dim") for note in d.notes]
    return Group(*parts)


def _plans(d: Distributed) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    host = any(p.host_bytes for p in d.plans)  # a column only where a plan offloads
    names = [*_PLAN_COLUMNS[:-1], *(["Host (offload)"] if host else []), _PLAN_COLUMNS[-1]]
    for name in names:
        table.add_column(name, justify="left" if name in ("Plan", "Peak in") else "right")
    for p in d.plans:
        if p.error:
            table.add_row(Text(p.spec), Text(p.error, style="yellow"))
            continue
        where = f"{p.peak_phase}" + (f" ({p.peak_where})" if p.peak_where else "")
        table.add_row(
            Text(p.spec + (f" rank {p.heaviest_rank}" if p.heaviest_rank else "")),
            format_bytes(p.per_rank_peak_bytes),
            format_bytes(p.param_bytes),
            format_bytes(p.grad_bytes),
            format_bytes(p.optimizer_bytes),
            format_bytes(p.saved_activation_bytes),
            format_bytes(p.comm_bytes),
            *([format_bytes(p.host_bytes)] if host else []),
            Text(where),
        )
    return table


def _gpus(d: Distributed) -> Table:
    budgets = sorted({g.budget_bytes for g in d.gpus_needed})
    strategies = list(dict.fromkeys(g.strategy for g in d.gpus_needed))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("Strategy")
    for b in budgets:
        table.add_column(budget_label(b), justify="right")
    for s in strategies:
        counts = {g.budget_bytes: g.gpus for g in d.gpus_needed if g.strategy == s}
        cells = [f"{counts[b]:,}" if counts.get(b) else "no fit" for b in budgets]
        table.add_row(Text(s), *cells)
    return table
