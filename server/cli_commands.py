"""The server commands behind `inspector serve`, `inspector worker`, `inspector db upgrade`.

`server.commands` (the parsers) imports this module when a command runs, so `inspector inspect`
never loads the web stack.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from typing import Any

from pydantic import ValidationError

from server.settings import Settings, get_settings

__all__ = ["serve", "worker", "db_upgrade", "token", "gc"]

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
    from server.worker import run_worker  # the queue and sandbox stack, on demand

    return int(run_worker(settings) or 0)


def _start_worker(settings: Settings) -> Any:
    from server.worker import start_embedded_worker, start_sweeper

    if not settings.embedded_worker:  # separate `inspector worker` processes run the jobs
        return start_sweeper(settings)
    return start_embedded_worker(settings)


def _sigterm_as_interrupt(_signum: int, _frame: Any) -> None:
    # uvicorn re-raises the signal after its graceful shutdown; the default SIGTERM
    # action would end the process before the worker is stopped.
    raise KeyboardInterrupt


def serve(host: str = "127.0.0.1", port: int = 8000) -> int:
    """Migrate, then run the web server with an embedded worker (unless
    INSPECTOR_EMBEDDED_WORKER=false: then the sweep alone); Ctrl-C stops both."""
    import uvicorn

    from server.app import create_app
    from server.logs import configure_logging

    settings = _settings()
    if settings is None or not _upgrade(settings):
        return 2 if settings is None else 1
    configure_logging(settings.log_format)
    app = create_app(settings)
    handle = _start_worker(settings)
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:  # log_config=None: keep our handlers (text or JSON) for uvicorn's records too
        uvicorn.run(app, host=host, port=port, log_level="info", log_config=None)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if handle is not None:
            handle.stop()
    return 0


def gc(args: Any) -> int:
    """`inspector gc --older-than 90d [--dry-run]`: delete old reports and unused uploads."""
    from server.gc import GcError, parse_age, run_gc

    settings = _settings()
    if settings is None:
        return 2
    try:
        age = parse_age(args.older_than)
    except GcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not _upgrade(settings):
        return 1
    result = run_gc(settings, older_than=age, dry_run=args.dry_run)
    print(result.summary(dry_run=args.dry_run))
    return 0


def token(args: Any) -> int:
    """`inspector token create NAME | list | revoke NAME|ID` on the configured database."""
    from server.tokens import TokenError

    settings = _settings()
    if settings is None:
        return 2
    if not _upgrade(settings):  # the tokens table comes with migration 0002
        return 1
    try:
        if args.token_action == "create":
            return token_create(settings, args.name, args.scope)
        if args.token_action == "list":
            return token_list(settings, as_json=args.json)
        return token_revoke(settings, args.token)
    except TokenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _token_session(settings: Settings) -> Any:
    from server.db import make_engine, make_session_factory, session_scope

    return session_scope(make_session_factory(make_engine(str(settings.database_url))))


def token_create(settings: Settings, name: str, scope: str = "upload") -> int:
    """Create a token; the plain token goes to stdout alone (for `$(...)`), once."""
    from server.tokens import create_token

    with _token_session(settings) as session:
        row, plain = create_token(session, name=name, scope=scope)
        ident = row.id
    print(plain)
    print(
        f"token {ident} {name!r} (scope {scope}) created. It is shown only now: store it as a "
        "CI secret (INSPECTOR_TOKEN).",
        file=sys.stderr,
    )
    return 0


def token_list(settings: Settings, as_json: bool = False) -> int:
    """Every token with its state; the secrets are not stored, so never shown."""
    from server.tokens import list_tokens

    with _token_session(settings) as session:
        rows = [_token_row(t) for t in list_tokens(session)]
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    head = ("ID", "NAME", "SCOPE", "PREFIX", "CREATED", "LAST USED", "STATE")
    print("{:>4}  {:<24} {:<7} {:<13} {:<17} {:<17} {}".format(*head))
    for r in rows:
        print(
            f"{r['id']:>4}  {r['name']:<24} {r['scope']:<7} {r['prefix']:<13} "
            f"{_short(r['created_at']):<17} {_short(r['last_used_at']):<17} {r['state']}"
        )
    return 0


def _token_row(t: Any) -> dict[str, Any]:
    def iso(when: Any) -> str | None:
        return when.isoformat() if when else None

    state = "revoked" if t.revoked_at else "active"
    return {
        "id": t.id, "name": t.name, "scope": t.scope, "prefix": t.prefix + "…", "state": state,
        "created_at": iso(t.created_at), "last_used_at": iso(t.last_used_at),
        "revoked_at": iso(t.revoked_at),
    }  # fmt: skip


def _short(iso: str | None) -> str:
    return iso[:16].replace("T", " ") if iso else "-"


def token_revoke(settings: Settings, name_or_id: str) -> int:
    """Revoke by name (its active token) or by id; requests with it get 401 at once."""
    from server.tokens import revoke_token

    with _token_session(settings) as session:
        rows = revoke_token(session, name_or_id=name_or_id)
        done = [f"{r.id} {r.name!r}" for r in rows]
    print(f"revoked token {', '.join(done)}")
    return 0
