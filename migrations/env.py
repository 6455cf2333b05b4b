"""Alembic environment: the URL comes from the caller (`server.db.upgrade_database`) or
from the service settings (`INSPECTOR_DATABASE_URL`, default SQLite in the data dir)."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context

from server.db import make_engine
from server.models import Base

config = context.config
if config.config_file_name is not None and not config.attributes.get("skip_logging"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _database_url() -> str:
    url = config.attributes.get("database_url")
    if url:
        return url
    from server.settings import get_settings

    return str(get_settings().database_url)


def run_migrations_offline() -> None:
    context.configure(url=_database_url(), target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(_database_url())
    try:
        with engine.connect() as connection:
            # SQLite cannot ALTER most things: batch mode rebuilds tables instead.
            context.configure(
                connection=connection,
                target_metadata=Base.metadata,
                render_as_batch=connection.dialect.name == "sqlite",
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
