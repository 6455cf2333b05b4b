"""Rendering: the Jinja environment (autoescape on) and its filters, `render`, the 404
page, and report JSON made safe to hand to the page's scripts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup

from inspector.schema.figures import FIGURES
from inspector.schema.findings import PROBLEM_VERDICTS
from inspector.schema.statuses import JOB_STATUSES, status_label
from inspector.units import format_bytes, format_count, format_flops
from server.pages.formats import pct, shape, when

__all__ = ["templates", "render", "not_found", "script_json"]

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"


def _make_env() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES_DIR), autoescape=True)
    env.trim_blocks = env.lstrip_blocks = True
    env.filters.update(bytes=format_bytes, count=format_count, flops=format_flops, shape=shape)
    env.filters.update(pct=pct)
    env.filters.update(status_label=status_label, when=when)
    env.globals["figures"] = FIGURES  # labels: {{ figures.train_peak_bytes.label }}
    env.globals["problem_verdicts"] = list(PROBLEM_VERDICTS)  # gradient verdicts to flag
    # Key order carries meaning in reports (forward order); sorting also costs time.
    env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    return env


templates = Jinja2Templates(env=_make_env())


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """Template `name` with `context`, plus what base.html needs on every page."""
    settings = getattr(request.app.state, "settings", None)
    unconfined = bool(settings and getattr(settings, "sandbox", "") == "none")
    context.update(unconfined=unconfined, statuses=JOB_STATUSES)
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def not_found(request: Request, what: str) -> HTMLResponse:
    return render(request, "not_found.html", status_code=404, what=what)


def script_json(text: str) -> Markup:
    """JSON text made safe inside <script>: `<`, `>`, `&` and `'` can only occur in JSON
    strings, where their \\u escapes mean the same; so `</script>` cannot end the tag."""
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        text = text.replace(char, escape)
    return Markup(text)
