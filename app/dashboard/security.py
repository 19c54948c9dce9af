"""The dashboard's gate: session cookie, CSRF token, same-origin check, role check, security headers."""

from __future__ import annotations

from quart import Response, g, request, url_for

from app.dashboard.session import COOKIE_NAME, DashboardSession, DashboardSigner, csrf_matches
from app.runtime import current_runtime

__all__ = [
    "CSP",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "DashboardError",
    "current_session",
    "gate",
    "secure_headers",
    "see_other",
    "set_session_cookie",
    "signer",
]

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
COOKIE_PATH = "/admin/ui"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Reachable without a session (the sign-in itself, and the CSS/JS the sign-in page needs).
_OPEN_ENDPOINTS = frozenset({"dashboard.login_form", "dashboard.login", "dashboard.static"})
# State-changing for the caller only, never for the system: a viewer may sign out.
_ANY_ROLE_POSTS = frozenset({"dashboard.logout"})
_SIGNER_KEY = "agent_async_dashboard_signer"


class DashboardError(Exception):
    """A refusal the dashboard answers on purpose, as an HTML page (the JSON API has ApiError)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def signer() -> DashboardSigner:
    from quart import current_app

    found: DashboardSigner | None = current_app.extensions.get(_SIGNER_KEY)
    if found is None:
        settings = current_runtime().settings
        found = DashboardSigner(
            settings.require_secret(), token_max_age_s=settings.dashboard_token_max_age_s,
            session_max_age_s=settings.dashboard_session_max_age_s,
        )
        current_app.extensions[_SIGNER_KEY] = found
    return found


def current_session() -> DashboardSession:
    session: DashboardSession | None = g.get("dashboard_session")
    if session is None:  # the gate runs first: only a handler of an open endpoint could get here
        raise DashboardError(401, "sign in to the dashboard first")
    return session


def _same_origin() -> bool:
    """A browser's own statement of where a request comes from: Fetch Metadata first, else Origin.

    Our pages send `Referrer-Policy: no-referrer`, with which a browser posts `Origin: null` even from
    our own page: "null" proves nothing either way, and neither does an absent header (older browsers,
    curl). The CSRF token still has to match in every case.
    """
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site == "same-origin"
    origin = request.headers.get("Origin")
    return origin is None or origin == "null" or origin == f"{request.scheme}://{request.host}"


async def gate() -> Response | None:
    """Blueprint before_request: who is calling, and may they do this."""
    if request.method not in _SAFE_METHODS and not _same_origin():
        raise DashboardError(403, "cross-site requests are refused")
    if request.endpoint in _OPEN_ENDPOINTS:
        return None
    session = signer().session(request.cookies.get(COOKIE_NAME))
    if session is None:
        if request.endpoint == "dashboard.events":  # an EventSource cannot follow a sign-in page
            raise DashboardError(401, "sign in to the dashboard first")
        return see_other(url_for("dashboard.login_form"))
    g.dashboard_session = session
    if request.method in _SAFE_METHODS:
        if request.endpoint != "dashboard.events":
            # Where the page's live stream will start: read before the page reads its data, so an event
            # between the two is replayed (a duplicate is harmless: events set states, they add nothing).
            g.events_after = await current_runtime().agent.events.last_id()
        return None
    form = await request.form
    sent = form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
    if not csrf_matches(session, sent):
        raise DashboardError(403, "the form is stale or was not sent by this dashboard: reload the page")
    if request.endpoint not in _ANY_ROLE_POSTS and not session.may_act:
        raise DashboardError(403, "a viewer cannot change anything: ask an operator")
    return None


async def secure_headers(response: Response) -> Response:
    """Blueprint after_request: every answer, error pages and static files included."""
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Content-Type-Options"] = "nosniff"
    if request.endpoint != "dashboard.static" and response.mimetype != "text/event-stream":
        response.headers["Cache-Control"] = "no-store"
    return response


def see_other(location: str, status: int = 303) -> Response:
    """A redirect after a form (303: the browser follows with a GET), as a Quart Response."""
    return Response("", status=status, headers={"Location": location})


def set_session_cookie(response: Response, value: str, *, max_age_s: int) -> None:
    response.set_cookie(
        COOKIE_NAME, value, max_age=max_age_s, path=COOKIE_PATH, httponly=True, samesite="Strict",
        secure=request.scheme == "https",
    )
