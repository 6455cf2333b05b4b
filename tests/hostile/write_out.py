"""Hostile: tries to write a file on the host, outside its job folder."""

MARKER = "__MARKER__"
try:
    with open(MARKER, "w") as f:
        f.write("escaped")
    OUTCOME = "wrote it"
except OSError as exc:
    OUTCOME = type(exc).__name__
raise RuntimeError(f"hostile write: {OUTCOME}")
