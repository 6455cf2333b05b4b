"""The zygote's wire: one JSON object a SOCK_SEQPACKET message, file descriptors beside it.

Torch-free: the worker (server/) and the zygote (inspector/zygote) both speak it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from typing import Any

__all__ = ["send", "recv", "MAX_MESSAGE_BYTES"]

MAX_MESSAGE_BYTES = 1024**2


def send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and the fds that came with it; (None, []) when the peer is gone."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE_BYTES, max_fds)
    if not data:
        return None, fds
    value = json.loads(data)
    return (value if isinstance(value, dict) else None), fds
