"""API tokens: created once (the plain token is shown then and never stored), listed, revoked.

Only the sha256 of a token is kept: 256 random bits need no salt or slow hash, since no
dictionary or brute force can reach them, and a stolen database yields no usable token.
"""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.models import ApiToken, utcnow

__all__ = [
    "TOKEN_PREFIX",
    "SCOPES",
    "TokenError",
    "new_token",
    "hash_token",
    "create_token",
    "list_tokens",
    "revoke_token",
    "find_token",
]

TOKEN_PREFIX = "insp_"  # recognisable in logs and by secret scanners
SCOPES = ("upload", "admin")  # upload: upload and re-run; admin: also delete


class TokenError(ValueError):
    """A token command that cannot be done; the message says why and what to do."""


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)  # 256 random bits


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(session: Session, *, name: str, scope: str = "upload") -> tuple[ApiToken, str]:
    """A new token named `name`; returns the row and the plain token (shown once)."""
    name = " ".join(name.split())
    if not name or len(name) > 100:
        raise TokenError("a token name is 1 to 100 characters, e.g. github-ci")
    if scope not in SCOPES:
        raise TokenError(f"scope {scope!r}: use one of {', '.join(SCOPES)}")
    if _active(session, name):
        raise TokenError(f"an active token is already named {name!r}: revoke it or pick another")
    plain = new_token()
    row = ApiToken(name=name, token_hash=hash_token(plain), prefix=plain[:12], scope=scope)
    session.add(row)
    session.flush()
    return row, plain


def _active(session: Session, name: str) -> list[ApiToken]:
    query = select(ApiToken).where(ApiToken.name == name, ApiToken.revoked_at.is_(None))
    return list(session.scalars(query))


def list_tokens(session: Session, *, include_revoked: bool = True) -> list[ApiToken]:
    query = select(ApiToken).order_by(ApiToken.id)
    if not include_revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    return list(session.scalars(query))


def revoke_token(session: Session, *, name_or_id: str) -> list[ApiToken]:
    """Revoke the active token(s) with this name, or the token with this id."""
    text = name_or_id.strip()
    rows = _active(session, text)
    if not rows and text.isdigit():
        row = session.get(ApiToken, int(text))
        rows = [row] if row is not None else []
    if not rows:
        raise TokenError(f"no active token named or numbered {text!r} (see `inspector token list`)")
    for row in rows:
        row.revoked_at = row.revoked_at or utcnow()
    session.flush()
    return rows


def find_token(session: Session, token: str) -> ApiToken | None:
    """The row of a presented token (revoked or not), by its hash."""
    return session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
