"""The server's subcommands of `inspector` (`serve`, `worker`, `db upgrade`, `gc`, `token`).

Registered through the `inspector.commands` entry-point group (pyproject.toml), so the
`inspector` CLI finds them without importing `server` by name. Only argparse here: the
implementations in `server.cli_commands` are imported when a command runs, so
`inspector inspect` and `--help` never load the web stack.
"""

from __future__ import annotations

import argparse
import importlib

__all__ = ["add_commands"]


def _run(name: str, *args: object) -> int:
    commands = importlib.import_module("server.cli_commands")  # the web stack, on demand
    return int(getattr(commands, name)(*args) or 0)


def add_commands(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="run the web service, queue and a worker here")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(func=lambda a: _run("serve", a.host, a.port))

    worker = commands.add_parser("worker", help="run a worker that takes jobs from the queue")
    worker.set_defaults(func=lambda a: _run("worker"))

    db = commands.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(dest="db_command", metavar="COMMAND", required=True)
    upgrade = db_commands.add_parser("upgrade", help="apply the database migrations")
    upgrade.set_defaults(func=lambda a: _run("db_upgrade"))

    gc = commands.add_parser("gc", help="delete old reports and their unused uploads (server)")
    gc.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 90d, 12h, 2w")
    gc.add_argument("--dry-run", action="store_true", help="list what would go; delete nothing")
    gc.set_defaults(func=lambda a: _run("gc", a))
    _add_token(commands)


def _add_token(commands: argparse._SubParsersAction) -> None:
    token = commands.add_parser("token", help="manage API tokens (server database)")
    actions = token.add_subparsers(dest="token_action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create a token and print it (once)")
    create.add_argument("name", metavar="NAME", help="what it is for, e.g. github-ci")
    create.add_argument(
        "--scope",
        choices=("upload", "admin"),
        default="upload",
        help="upload: upload and re-run (CI); admin: also delete reports",
    )
    listing = actions.add_parser("list", help="list tokens (never their secrets)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    revoke = actions.add_parser("revoke", help="revoke a token by name or id")
    revoke.add_argument("token", metavar="NAME|ID")
    token.set_defaults(func=lambda a: _run("token", a))
