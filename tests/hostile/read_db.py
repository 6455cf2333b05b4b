"""Hostile: tries to read the server's database file."""

DB = "__DB__"
try:
    with open(DB, "rb") as f:
        OUTCOME = f"read {len(f.read())} bytes"
except OSError as exc:
    OUTCOME = type(exc).__name__
raise RuntimeError(f"hostile db: {OUTCOME}")
