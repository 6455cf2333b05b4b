"""Engine, sessions and the FastAPI session dependency."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

__all__ = [
    "make_engine",
    "make_session_factory",
    "session_scope",
    "get_db",
    "SessionDep",
    "upgrade_database",
    "downgrade_database",
]


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for `url`; SQLite gets its directory created, foreign keys and WAL."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        # Up to 50 connections: more than the web server's 40 request threads, so a burst of
        # requests waits on the database, never times out waiting for the pool (a 500).
        pool = {"pool_size": 10, "max_overflow": 40, "pool_timeout": 60} | kwargs
        return create_engine(url, pool_pre_ping=True, **pool)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Cascading tag deletes need foreign keys; WAL lets the worker write while pages read.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on any error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


async def get_db(request: Request) -> AsyncIterator[Session]:
    """One session per request, from the factory `create_app` put on the app state.

    Async on purpose: its close runs on the event loop. A sync generator's close needs a
    free threadpool thread, and under load every thread can be blocked waiting for a pooled
    connection that only such a close would give back (a deadlock; seen in bench/load.py)."""
    session = request.app.state.session_factory()
    try:
        yield session
    finally:
        session.close()


# scope="function": the session (and its pooled connection) is closed when the endpoint
# returns, not after the response is sent: slow readers of big reports must not hold
# database connections (the pool ran dry under 100 readers in bench/load.py).
SessionDep = Annotated[Session, Depends(get_db, scope="function")]


def release(session: Session) -> None:
    """Give the session's connection back to the pool now, from the request's own thread.

    The dependency's close runs on the event loop after the endpoint returns; while the
    loop is busy sending big responses, threads start new requests and the pool runs dry
    (500s under 100 readers in bench/load.py). Objects already loaded stay readable
    (expire_on_commit=False); the session reconnects if used again."""
    session.close()


MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(url: str) -> Any:
    """An Alembic config for `url`, built in code (no alembic.ini needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["database_url"] = url  # not an ini option: '%' in passwords is fine
    return config


def upgrade_database(url: str, revision: str = "head") -> None:
    """Apply the migrations to `url` (what `inspector db upgrade` and `serve` run)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade_database(url: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)
