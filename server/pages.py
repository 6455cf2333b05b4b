"""HTML pages: upload, the report list, two reports compared, and the helpers the report
page (server/reportpage.py) shares with them.

Server-rendered Jinja (autoescape on) plus small scripts in `static/js/`. Report data
reaches the scripts as `<script type="application/json">` filled with `|tojson`.
The web process never imports torch: only `inspector.report`, `inspector.units` and
`inspector.compare` are read here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup
from pydantic import ValidationError
from sqlalchemy import Select, Text, cast, func, or_, select
from sqlalchemy.orm import Session, defer, selectinload

from inspector.report import Report
from inspector.schema.presets import PRESETS, preset_names
from inspector.schema.statuses import JOB_STATUSES, status_label
from inspector.units import ACCELERATOR_BUDGETS, format_bytes, format_count
from server.api.errors import ApiError
from server.auth import identify
from server.db import SessionDep
from server.models import Job, Tag

__all__ = ["router", "templates", "summary_cards", "compare_view"]

router = APIRouter(tags=["pages"])
_ROOT = Path(__file__).resolve().parent.parent
PER_PAGE = 25
SEVERITIES = ("error", "warning", "info")

# What a user can do about each kind of failure.
ERROR_ADVICE = {
    "user_error": "The error is in the uploaded code or input: fix it and upload again.",
    "timed_out": "The job ran past the time limit: try a smaller input, or fake tensors.",
    "out_of_memory": "The job ran out of memory: try a smaller batch, or fake tensors.",
    "killed": "The job was stopped by the sandbox; the reason is above.",
    "internal": "This is a bug in the inspector, not in your model: re-run, or report it.",
}


def _shape(shapes: Any) -> str:
    """[["B", 3, 224]] -> 'B×3×224'; several tensors joined by commas."""
    if not shapes:
        return ""
    if not isinstance(shapes[0], list):
        shapes = [shapes]
    return ", ".join("×".join(str(d) for d in s) if s else "scalar" for s in shapes)


def _pct(value: float | None) -> str:
    if value is None or math.isinf(value) or math.isnan(value):
        return "-"
    return f"{value:+.1f}%"


def _make_env() -> Environment:
    env = Environment(loader=FileSystemLoader(_ROOT / "templates"), autoescape=True)
    env.trim_blocks = env.lstrip_blocks = True
    env.filters.update(bytes=format_bytes, count=format_count, shape=_shape, pct=_pct)
    env.filters["status_label"] = status_label
    env.filters["when"] = lambda t: t.strftime("%Y-%m-%d %H:%M UTC") if t else "-"
    # Key order carries meaning in reports (forward order); sorting also costs time.
    env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    return env


templates = Jinja2Templates(env=_make_env())


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    settings = getattr(request.app.state, "settings", None)
    unconfined = bool(settings and getattr(settings, "sandbox", "") == "none")
    context.update(unconfined=unconfined, statuses=JOB_STATUSES)
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def may_list(request: Request, session: Session) -> bool:
    """With authentication on, only an identified caller (a token, or the sign-in proxy's
    header) sees the list of reports: it would reveal every unguessable link."""
    settings = request.app.state.settings
    if settings.auth == "none":
        return True
    try:
        identify(request, session, settings)
    except ApiError:
        return False
    return True


def not_found(request: Request, what: str) -> HTMLResponse:
    return render(request, "not_found.html", status_code=404, what=what)


# --- data access -------------------------------------------------------------------


def _listing() -> Select:
    # Lists never need the (large) report or error JSON.
    return select(Job).options(
        defer(Job.report_json), defer(Job.error_json), selectinload(Job.tags)
    )


def job_and_text(session: Session, slug: str) -> tuple[Job | None, str | None]:
    """The job and its report as stored JSON text: the page hands that text to its
    scripts as is, rather than parsing and re-serializing megabytes."""
    query = (
        select(Job, cast(Job.report_json, Text))
        .options(defer(Job.report_json), selectinload(Job.tags))
        .where(Job.slug == slug)
    )
    row = session.execute(query).first()
    return (row[0], row[1]) if row else (None, None)


def _recent(session: Session, *, limit: int = 8, status: str | None = None) -> list[Job]:
    query = _listing().order_by(Job.id.desc()).limit(limit)
    if status:
        query = query.where(Job.status == status)
    return list(session.scalars(query))


def _search(session: Session, *, q: str, status: str, page: int) -> tuple[list[Job], int]:
    """Jobs matching `q` (name, tag value or `key=value`) and `status`, newest first."""
    query = _listing()
    if q:
        tags = select(Tag.job_id)
        if "=" in q:
            key, _, value = q.partition("=")
            tags = tags.where(Tag.key == key.strip(), Tag.value == value.strip())
            query = query.where(Job.id.in_(tags))
        else:
            like = f"%{q}%"
            tags = tags.where(or_(Tag.value.ilike(like), Tag.key.ilike(like)))
            query = query.where(or_(Job.name.ilike(like), Job.id.in_(tags)))
    if status:
        query = query.where(Job.status == status)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(
        query.order_by(Job.id.desc()).offset((page - 1) * PER_PAGE).limit(PER_PAGE)
    )
    return list(rows), total


def parse_report(text: str | None, *, modules: bool = False) -> tuple[Report | None, dict]:
    """The report without its long lists (nodes, the timeline, and unless asked, modules),
    and the raw dict. The templates show figures; the scripts read the lists from the raw
    JSON. Validating 5,000 nodes would cost the page most of a second."""
    try:
        raw = json.loads(text) if text else None
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        return None, {}
    slim = {**raw, "nodes": []}
    if not modules:
        slim["modules"] = []
    if isinstance(raw.get("memory"), dict):
        slim["memory"] = {**raw["memory"], "timeline": []}
    try:
        return Report.model_validate(slim), raw
    except ValidationError:
        return None, raw


def script_json(text: str) -> Markup:
    """JSON text made safe inside <script>: `<`, `>`, `&` and `'` can only occur in JSON
    strings, where their \\u escapes mean the same; so `</script>` cannot end the tag."""
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        text = text.replace(char, escape)
    return Markup(text)


# --- view models ----------------------------------------------------------------------


def summary_cards(report: Report, module_count: int) -> list[dict[str, str]]:
    """The figures at the top of a report: label, value, a line of detail."""
    t, m = report.totals, report.memory
    optimizer = m.optimizer or "no optimizer"
    return [
        _card("Parameters", format_count(t.params),
              f"{format_count(t.trainable_params)} trainable · {format_bytes(t.param_bytes)}"),
        _card("Forward FLOPs", format_count(t.flops_forward),
              f"backward {format_count(t.flops_backward)}"),
        _card("Forward peak", format_bytes(m.forward_peak_bytes), "one forward, no grad"),
        _card("Training-step peak", format_bytes(m.train_peak_bytes),
              f"{optimizer}" + (f" · at {m.train_peak_node}" if m.train_peak_node else "")),
        _card("Capture", report.capture.method or "none",
              f"{report.capture.node_count} nodes · {module_count} modules"),
    ]  # fmt: skip


def _card(label: str, value: str, detail: str) -> dict[str, str]:
    return {"label": label, "value": value, "detail": detail}


def max_batch_rows(report: Report) -> list[dict[str, Any]]:
    """Largest batch per accelerator size: the report's own budgets, else the common sizes."""
    known = {int(k): v for k, v in report.memory.max_batch.items() if str(k).isdigit()}
    budgets = sorted(known) or []
    return [{"budget": format_bytes(b), "batch": known.get(b)} for b in budgets]


def severity_counts(report: Report) -> dict[str, int]:
    counts = dict.fromkeys(SEVERITIES, 0)
    for finding in report.findings:
        counts[finding.severity] = counts.get(finding.severity, 0) + 1
    return counts


def numeric_issues(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Nodes (raw report JSON) whose outputs hold NaN/Inf, dead or saturated units, or
    fp16 overflows."""
    rows = []
    for node in nodes:
        s = node.get("stats") or {}
        problems = [
            f"{s['nan_count']} NaN" if s.get("nan_count") else "",
            f"{s['inf_count']} Inf" if s.get("inf_count") else "",
            f"{s['dead_fraction']:.0%} dead" if s.get("dead_fraction") else "",
            f"{s['saturated_fraction']:.0%} saturated" if s.get("saturated_fraction") else "",
            f"{s['fp16_overflow_count']} over fp16 range" if s.get("fp16_overflow_count") else "",
        ]
        if any(problems):
            rows.append(
                {"node": node.get("name", "?"), "problems": ", ".join(filter(None, problems))}
            )
    return rows


def error_of(job: Job, report: Report | None) -> dict[str, Any]:
    error = dict(job.error_json or {})
    if not error and report is not None and report.error is not None:
        error = report.error.model_dump()
    error.setdefault("kind", job.error_kind or job.status)
    error.setdefault("message", job.error_message or "The job did not finish.")
    error.setdefault("stage", job.stage)
    error["advice"] = ERROR_ADVICE.get(error["kind"], ERROR_ADVICE.get(job.status, ""))
    return error


def unreadable(job: Job) -> dict[str, Any]:
    return {
        "kind": "internal",
        "message": "This report's data is missing or unreadable by this version.",
        "stage": None,
        "advice": ERROR_ADVICE["internal"],
    }


def report_context(report: Report, raw: dict[str, Any]) -> dict[str, Any]:
    nodes = raw.get("nodes") or []
    return {
        "report": report,
        "cards": summary_cards(report, len(raw.get("modules") or [])),
        "max_batch": max_batch_rows(report),
        "severity": severity_counts(report),
        "numeric": numeric_issues(nodes),
        "has_stats": any(n.get("stats") for n in nodes),
        "has_rows": bool(nodes or raw.get("modules")),
        "budgets": ACCELERATOR_BUDGETS,
    }


# --- routes ---------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def upload_page(request: Request, session: SessionDep) -> HTMLResponse:
    """Upload a model; the latest reports below."""
    presets = [PRESETS[name] for name in preset_names()]
    recent = _recent(session) if may_list(request, session) else []
    return render(request, "upload.html", recent=recent, presets=presets)


@router.get("/reports", response_class=HTMLResponse, include_in_schema=False)
def reports_page(
    request: Request, session: SessionDep, q: str = "", status: str = "", page: int = 1
) -> HTMLResponse:
    """All reports, newest first, searchable by name, tag and status."""
    if not may_list(request, session):
        return render(request, "sign_in.html", status_code=401)
    q, page = q.strip()[:200], max(page, 1)
    status = status if status in JOB_STATUSES else ""
    jobs, total = _search(session, q=q, status=status, page=page)
    pages = max(1, math.ceil(total / PER_PAGE))
    return render(
        request, "reports.html", jobs=jobs, total=total, q=q, status=status, page=page,
        pages=pages,
    )  # fmt: skip


def _ready(found: tuple[Job | None, str | None]) -> Report | None:
    job, text = found
    return parse_report(text, modules=True)[0] if job and job.status == "done" else None


@router.get("/compare/{pair}", response_class=HTMLResponse, include_in_schema=False)
def compare_page(request: Request, pair: str, session: SessionDep) -> HTMLResponse:
    """Two reports side by side: `/compare/<a>..<b>`."""
    a_slug, sep, b_slug = pair.partition("..")
    found = [job_and_text(session, s) for s in (a_slug, b_slug)] if sep else [(None, None)] * 2
    jobs = [job for job, _ in found]
    reports = [_ready(f) for f in found]
    if None in reports:
        return not_found(request, "pair of finished reports")
    view = compare_view(reports[0], reports[1])
    return render(request, "compare.html", a=jobs[0], b=jobs[1], view=view)


# --- compare ------------------------------------------------------------------------------

# (figure in inspector.compare.FIGURES, label, unit) in display order.
COMPARE_FIGURES = (
    ("params", "Parameters", "count"),
    ("trainable_params", "Trainable parameters", "count"),
    ("flops_forward", "Forward FLOPs", "count"),
    ("flops_backward", "Backward FLOPs", "count"),
    ("forward_peak_bytes", "Forward peak", "bytes"),
    ("train_peak_bytes", "Training-step peak", "bytes"),
    ("saved_activation_bytes", "Saved activations", "bytes"),
    ("param_bytes", "Parameter memory", "bytes"),
    ("grad_bytes", "Gradient memory", "bytes"),
    ("optimizer_bytes", "Optimizer state", "bytes"),
    ("node_count", "Graph nodes", "count"),
    ("findings_errors", "Errors", "count"),
    ("findings_warnings", "Warnings", "count"),
)
MODULE_ROWS_SHOWN = 500


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "bytes":
        return format_bytes(value)
    return format_count(value) if abs(value) >= 10_000 else f"{value:,}"


def _signed(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return ("+" if value > 0 else "") + _fmt(value, unit) if value else "0"


def compare_view(a: Report, b: Report) -> dict[str, Any]:
    """`inspector.compare.compare_reports` arranged for the page: labels, units, rows."""
    from inspector.compare import compare_reports

    diff = compare_reports(a, b)
    summary = []
    for key, label, unit in COMPARE_FIGURES:
        d = diff["summary"].get(key)
        if d is None:
            continue
        summary.append({
            "key": key, "label": label, "a": _fmt(d["a"], unit), "b": _fmt(d["b"], unit),
            "delta": _signed(d["delta"], unit), "percent": _pct(d["percent"]),
            "direction": d["direction"],
        })  # fmt: skip
    return {
        "summary": summary,
        "max_batch": _max_batch_deltas(diff.get("max_batch", {})),
        "modules": _module_rows(diff["modules"]),
        "unchanged": diff["modules"].get("unchanged", 0),
        "findings": diff.get("findings", {"added": [], "resolved": []}),
        "grads": {"a": _grad_series(a), "b": _grad_series(b)},
    }


def _max_batch_deltas(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"budget": format_bytes(int(k)), **d} for k, d in rows.items() if k.isdigit()]


def _module_rows(modules: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [
        {"status": "added", "path": m["path"], "type": m["type"],
         "shapes": _shape(m["output_shapes"]), "params": format_count(m["params"])}
        for m in modules["added"]
    ] + [
        {"status": "removed", "path": m["path"], "type": m["type"],
         "shapes": _shape(m["output_shapes"]), "params": format_count(m["params"])}
        for m in modules["removed"]
    ]  # fmt: skip
    rows += [_changed_row(c) for c in modules["changed"]]
    return sorted(rows, key=lambda r: r["path"])


def _changed_row(change: dict[str, Any]) -> dict[str, Any]:
    c = change["changes"]
    row = {"status": "changed", "path": change["path"], "type": change["type"]}
    if "type" in c:
        row["type"] = f"{c['type']['a']} → {c['type']['b']}"
    if "output_shapes" in c:
        row["shapes"] = f"{_shape(c['output_shapes']['a'])} → {_shape(c['output_shapes']['b'])}"
    if "params" in c:
        row["params"] = _signed(c["params"]["delta"], "count")
    if "output_bytes" in c:
        row["memory"] = _signed(c["output_bytes"]["delta"], "bytes")
    if "flops_forward" in c:
        row["flops"] = _signed(c["flops_forward"]["delta"], "count")
    return row


def _grad_series(report: Report) -> list[dict[str, Any]]:
    layers = sorted(report.gradients.layers, key=lambda g: g.depth_index)
    return [{"path": g.module_path, "grad_norm": g.grad_norm} for g in layers]
