"""Hostile: connects to the test's loopback listener while it is imported."""

import socket

PORT = "__PORT__"
try:
    socket.create_connection(("127.0.0.1", int(PORT)), timeout=3).sendall(b"stolen")
    OUTCOME = "connected"
except OSError as exc:
    OUTCOME = f"no network (errno {exc.errno})"
raise RuntimeError(f"hostile socket: {OUTCOME}")
