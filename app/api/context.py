"""Request helpers: the authenticated caller and the process runtime."""

from __future__ import annotations

from quart import g

from app.auth import Principal
from app.errors import ApiError
from app.runtime import AppRuntime, current_runtime

__all__ = ["current_principal", "current_runtime", "runtime"]


def current_principal() -> Principal:
    """The caller authenticated by the app's before_request hook (never a client-sent user id)."""
    principal: Principal | None = g.get("principal")
    if principal is None:
        raise ApiError(401, "missing_token", "send Authorization: Bearer <token>")
    return principal


def runtime() -> AppRuntime:
    return current_runtime()
