"""HTML pages: upload, the list of reports, a report, two reports compared.

Server-rendered Jinja (autoescape on) plus small scripts in `static/js/`. Report data
reaches the scripts as `<script type="application/json">`. One idea per module:

- `rendering`: the Jinja environment, its filters, `render`, `not_found`, `script_json`
- `access`: who may see the lists of reports
- `reportview`, `failureview`, `compareview`, `uploadview`: view models
- `routes` (upload, list, compare) and `report` (the report page and its kept copies)

Data access is `server.api.queries`, shared with the API. The web process never imports
torch: only `inspector.report`, `inspector.units`, `inspector.compare` and
`inspector.schema` are read here.
"""

from __future__ import annotations

from fastapi import APIRouter

from server.pages import report, routes

__all__ = ["router"]

router = APIRouter()
router.include_router(routes.router)
router.include_router(report.router)
