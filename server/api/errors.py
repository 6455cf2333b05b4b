"""One JSON error shape everywhere: `{"error": {"code", "message", "detail"}}`."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["ApiError", "error_response", "install_error_handlers"]

log = logging.getLogger("server.api")

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    410: "gone",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "rate_limited",
    503: "unavailable",
}


class ApiError(HTTPException):
    """An error meant for the user. Subclasses FastAPI's HTTPException so that one raised
    while the request body is still being read passes through FastAPI untouched."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        detail: Any = None,
        headers: dict[str, str] | None = None,  # e.g. WWW-Authenticate, Retry-After
    ) -> None:
        super().__init__(status_code=status, detail=message, headers=headers)
        self.code = code
        self.message = message
        self.extra = detail


def error_response(
    status: int, code: str, message: str, detail: Any = None, headers: dict | None = None
) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "detail": jsonable_encoder(detail)}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _api_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status_code, exc.code, exc.message, exc.extra, exc.headers)


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _CODES.get(exc.status_code, f"http_{exc.status_code}")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    return error_response(exc.status_code, code, message, headers=exc.headers)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # Only where and what: echoing `input` could send an uploaded file back.
    detail = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type")}
        for e in exc.errors()
    ]
    first = detail[0] if detail else {"loc": [], "msg": "invalid request"}
    where = ".".join(str(p) for p in first["loc"] if p not in ("body", "query", "path"))
    message = f"{where}: {first['msg']}" if where else str(first["msg"])
    return error_response(422, "invalid", message, detail)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    message = "internal error: this is a bug on our side; the server log has the details"
    return error_response(500, "internal", message)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _internal_error)
