"""Refuse request bodies over the upload limit before they are spooled to disk."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.api.errors import ApiError, error_response

__all__ = ["BodyLimit", "FORM_SLACK_BYTES"]

# Room for the form's text fields and multipart boundaries beside the model file.
FORM_SLACK_BYTES = 1024 * 1024


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _message(self) -> str:
        return f"the request is larger than the {self.max_bytes} bytes this server accepts"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            response = error_response(413, "too_large", self._message())
            return await response(scope, receive, send)
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # chunked bodies carry no length: count them
                raise ApiError(413, "too_large", self._message())
            return message

        await self.app(scope, limited, send)
