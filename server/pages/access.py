"""Who may see the lists of reports (the pages' counterpart of the API's IdentityDep)."""

from __future__ import annotations

from fastapi import Request
from sqlalchemy.orm import Session

from server.api.errors import ApiError
from server.auth import identify

__all__ = ["may_list"]


def may_list(request: Request, session: Session) -> bool:
    """With authentication on, only an identified caller (a token, or the sign-in proxy's
    header) sees the list of reports: it would reveal every unguessable link."""
    settings = request.app.state.settings
    if settings.auth == "none":
        return True
    try:
        identify(request, session, settings)
    except ApiError:
        return False
    return True
