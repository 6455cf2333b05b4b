"""The server commands behind `inspector serve`, `inspector worker`, `inspector db upgrade`.

`inspector/cli.py` imports this module lazily, so `inspector inspect` never loads the web stack.
"""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any

from pydantic import ValidationError

from server.settings import Settings, get_settings

__all__ = ["serve", "worker", "db_upgrade"]

log = logging.getLogger("server")


def _settings() -> Settings | None:
    try:
        return get_settings()
    except (ValidationError, ValueError) as exc:
        print(f"error: bad settings (INSPECTOR_* environment variables):\n{exc}", file=sys.stderr)
        return None


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _upgrade(settings: Settings) -> bool:
    from server.db import upgrade_database

    try:
        upgrade_database(str(settings.database_url))
    except Exception as exc:  # unreachable database, bad URL: say which, no traceback
        print(
            f"error: cannot migrate {_safe_url(str(settings.database_url))}: {exc}", file=sys.stderr
        )
        return False
    return True


def db_upgrade() -> int:
    """Apply the migrations; 0 when the schema is current."""
    settings = _settings()
    if settings is None or not _upgrade(settings):
        return 2 if settings is None else 1
    print(f"database {_safe_url(str(settings.database_url))} is up to date")
    return 0


def worker() -> int:
    """Run a worker until stopped (the worker engineer's `server.worker.run_worker`)."""
    settings = _settings()
    if settings is None:
        return 2
    try:
        from server.worker import run_worker
    except ImportError as exc:
        print(f"error: the worker is not available in this install ({exc})", file=sys.stderr)
        return 2
    return int(run_worker(settings) or 0)


def _start_worker(settings: Settings) -> Any:
    try:
        from server.worker import start_embedded_worker
    except ImportError as exc:
        log.warning("no embedded worker (%s): uploads will wait in the queue", exc)
        return None
    return start_embedded_worker(settings)


def _sigterm_as_interrupt(_signum: int, _frame: Any) -> None:
    # uvicorn re-raises the signal after its graceful shutdown; the default SIGTERM
    # action would end the process before the worker is stopped.
    raise KeyboardInterrupt


def serve(host: str = "127.0.0.1", port: int = 8000) -> int:
    """Migrate, then run the web server with an embedded worker; Ctrl-C stops both."""
    import uvicorn

    from server.app import create_app

    settings = _settings()
    if settings is None or not _upgrade(settings):
        return 2 if settings is None else 1
    logging.basicConfig(level=logging.INFO, format="%(levelname)s [%(name)s] %(message)s")
    app = create_app(settings)
    handle = _start_worker(settings)
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        uvicorn.run(app, host=host, port=port, log_level="info")
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if handle is not None:
            handle.stop()
    return 0
