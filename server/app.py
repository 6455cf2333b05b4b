"""The FastAPI app factory: routers, the JSON error shape, static files, pages."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from inspector import __version__
from server.api import compare, create, health, ops, reports
from server.api.errors import install_error_handlers
from server.api.middleware import FORM_SLACK_BYTES, BodyLimit
from server.db import make_engine, make_session_factory
from server.pages import router as pages_router
from server.readcache import ReadCache
from server.settings import Settings, get_settings
from server.storage import open_store

__all__ = ["create_app"]

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


def create_app(settings: Settings | None = None) -> FastAPI:
    """The web app; the database schema comes from migrations (`inspector db upgrade`)."""
    settings = settings or get_settings()
    app = FastAPI(title="Model Graph Inspector", version=__version__)
    app.state.settings = settings
    app.state.engine = make_engine(settings.database_url)
    app.state.session_factory = make_session_factory(app.state.engine)
    app.state.store = open_store(settings, app.state.engine)
    app.state.read_cache = ReadCache(settings.read_cache_bytes, settings.read_cache_ttl_s)
    app.state.upload_turns = asyncio.Semaphore(create.UPLOADS_AT_ONCE)
    app.state.metrics = ops.metrics_registry(app.state.session_factory, settings)
    app.add_middleware(BodyLimit, max_bytes=settings.max_upload_bytes + FORM_SLACK_BYTES)
    install_error_handlers(app)
    for module in (create, reports, compare, health, ops):
        app.include_router(module.router)
    if STATIC_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.include_router(pages_router)
    return app
