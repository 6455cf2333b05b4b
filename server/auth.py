"""Who may change things: API tokens, a trusted proxy's identity header, the upload rate.

Reading stays open: a report is reached by its unguessable link. With
`INSPECTOR_AUTH=token`, uploads, re-runs, deletes and the report list need an identity:
`Authorization: Bearer <token>`, or the header an authenticating reverse proxy sets
(`INSPECTOR_TRUSTED_IDENTITY_HEADER`; the proxy must strip it from clients' requests).

The upload rate limit is a sliding window kept in the database (`upload_events`), not in
process memory: several web processes behind a balancer share one count, and a restart
does not reset it. Its count-then-insert is not atomic, so a burst of concurrent uploads may
pass a few over the limit; it is a brake on runaway CI loops, not an exact quota.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Request
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from server.api.errors import ApiError
from server.db import SessionDep
from server.models import UploadEvent, utcnow
from server.settings import Settings
from server.tokens import find_token

__all__ = [
    "Identity",
    "identify",
    "known_identity",
    "require_identity",
    "require_admin",
    "require_uploader",
    "check_upload_rate",
    "IdentityDep",
    "AdminDep",
    "UploaderDep",
    "RATE_WINDOW_S",
    "AUTH_RESPONSES",
    "UPLOAD_AUTH_RESPONSES",
    "ADMIN_RESPONSES",
]

RATE_WINDOW_S = 60
_BEARER = {"WWW-Authenticate": 'Bearer realm="inspector"'}
_HOW = "send `Authorization: Bearer <token>`; an operator creates one with `inspector token create`"


@dataclass(frozen=True)
class Identity:
    kind: Literal["anonymous", "token", "proxy"]
    name: str
    token_id: int | None = None
    scope: str = "admin"  # tokens carry theirs; people behind the proxy may do everything

    @property
    def rate_key(self) -> str | None:
        """Whose uploads are counted together; None: not limited (open mode)."""
        if self.kind == "token":
            return f"token:{self.token_id}"
        return f"user:{self.name}" if self.kind == "proxy" else None


ANONYMOUS = Identity(kind="anonymous", name="anonymous")


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers=_BEARER)


def identify(request: Request, session: Session, settings: Settings) -> Identity:
    """The caller's identity; 401 when authentication is on and none is valid."""
    known = known_identity(request, settings)
    return known if known is not None else _token_identity(session, _bearer_token(request))


def known_identity(request: Request, settings: Settings) -> Identity | None:
    """The caller's identity as far as the headers tell it: the proxy's user, or anyone in
    open mode; None when an API token is to be looked up; 401 when there is none."""
    header = settings.trusted_identity_header
    user = request.headers.get(header, "").strip() if header else ""
    if user:
        return Identity(kind="proxy", name=user[:200])
    if settings.auth == "none":
        return ANONYMOUS
    if not _bearer_token(request):
        raise _unauthorized(f"authentication required: {_HOW}")
    return None


def _bearer_token(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _token_identity(session: Session, token: str) -> Identity:
    row = find_token(session, token)
    if row is None:
        raise _unauthorized(f"invalid API token: check the secret, or {_HOW}")
    if row.revoked_at is not None:
        when = row.revoked_at.strftime("%Y-%m-%d %H:%M UTC")
        raise _unauthorized(f"API token {row.name!r} was revoked on {when}; use a new token")
    row.last_used_at = utcnow()
    session.commit()
    return Identity(kind="token", name=row.name, token_id=row.id, scope=row.scope)


def require_identity(request: Request, session: SessionDep) -> Identity:
    """Dependency: an authenticated caller (anyone when INSPECTOR_AUTH=none)."""
    return identify(request, session, request.app.state.settings)


IdentityDep = Annotated[Identity, Depends(require_identity)]


def require_admin(identity: IdentityDep) -> Identity:
    """Dependency: deleting needs more than a CI upload token."""
    if identity.scope != "admin":
        raise ApiError(
            403, "forbidden",
            f"token {identity.name!r} may upload and re-run, not delete; "
            "use a token created with `inspector token create NAME --scope admin`",
        )  # fmt: skip
    return identity


AdminDep = Annotated[Identity, Depends(require_admin)]


def require_uploader(request: Request, session: SessionDep, identity: IdentityDep) -> Identity:
    """Dependency: an authenticated caller within its upload rate."""
    check_upload_rate(session, identity, request.app.state.settings.upload_rate_per_minute)
    return identity


UploaderDep = Annotated[Identity, Depends(require_uploader)]


def check_upload_rate(session: Session, identity: Identity, per_minute: int) -> None:
    """Count this upload attempt in the identity's window; 429 with Retry-After when full."""
    key = identity.rate_key
    if key is None or per_minute <= 0:
        return
    now = utcnow()
    start = now - dt.timedelta(seconds=RATE_WINDOW_S)
    session.execute(delete(UploadEvent).where(UploadEvent.at < start))  # keep the table small
    count, oldest = session.execute(
        select(func.count(UploadEvent.id), func.min(UploadEvent.at)).where(UploadEvent.key == key)
    ).one()
    if count >= per_minute:
        session.commit()
        raise _rate_limited(identity, per_minute, _seconds_until(oldest, now))
    session.add(UploadEvent(key=key, at=now))
    session.commit()


def _seconds_until(oldest: dt.datetime | None, now: dt.datetime) -> int:
    if oldest is None:
        return 1
    if oldest.tzinfo is None:  # func.min on SQLite returns the stored naive UTC text
        oldest = oldest.replace(tzinfo=dt.timezone.utc)
    return max(1, math.ceil(RATE_WINDOW_S - (now - oldest).total_seconds()))


def _rate_limited(identity: Identity, per_minute: int, retry_after: int) -> ApiError:
    return ApiError(
        429, "rate_limited",
        f"{identity.name!r} has made {per_minute} uploads in the last {RATE_WINDOW_S} s "
        f"(the limit, INSPECTOR_UPLOAD_RATE_PER_MINUTE); retry in {retry_after} s",
        {"limit_per_minute": per_minute, "retry_after_s": retry_after},
        headers={"Retry-After": str(retry_after)},
    )  # fmt: skip


def _described(status: int, description: str) -> dict:
    from server.api.schemas import ErrorResponse

    return {status: {"model": ErrorResponse, "description": description}}


# For the OpenAPI `responses=` of the guarded routes.
AUTH_RESPONSES = _described(401, "authentication required (INSPECTOR_AUTH=token)")
UPLOAD_AUTH_RESPONSES = AUTH_RESPONSES | _described(429, "upload rate limit; see Retry-After")
ADMIN_RESPONSES = AUTH_RESPONSES | _described(403, "the token may not delete (scope upload)")
