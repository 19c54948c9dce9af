"""Dashboard access: sign-in tokens minted by the CLI, exchanged for a signed, expiring session cookie."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from itsdangerous import BadData, URLSafeTimedSerializer

__all__ = ["COOKIE_NAME", "DashboardRole", "DashboardSession", "DashboardSigner", "SignInError"]

# Separate salts: a sign-in token is not a session cookie, and neither is an API bearer token, even
# though all three are signed with AGENT_SECRET_KEY.
_SIGN_IN_SALT = "agent-async.dashboard-sign-in.v1"
_SESSION_SALT = "agent-async.dashboard-session.v1"
_MAX_UID_CHARS = 255
COOKIE_NAME = "agent_dashboard"


class DashboardRole(StrEnum):
    VIEWER = "viewer"  # sees every page, may change nothing
    OPERATOR = "operator"  # may also cancel, retry, edit schedules, reset guards


class SignInError(Exception):
    """A sign-in token that is not valid (tampered, expired, malformed): the message says which."""


@dataclass(frozen=True, slots=True)
class DashboardSession:
    uid: str
    role: DashboardRole
    # Per session: a form or fetch must echo it back (CSRF); never sent anywhere but in our pages.
    csrf_token: str
    expires_at_s: float

    @property
    def may_act(self) -> bool:
        return self.role is DashboardRole.OPERATOR


class DashboardSigner:
    """Signs and checks sign-in tokens and session cookies with the app's secret."""

    def __init__(
        self, secret_key: str, *, token_max_age_s: int, session_max_age_s: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        digest = {"digest_method": hashlib.sha256}
        self._sign_in = URLSafeTimedSerializer(secret_key, salt=_SIGN_IN_SALT, signer_kwargs=digest)
        self._session = URLSafeTimedSerializer(secret_key, salt=_SESSION_SALT, signer_kwargs=digest)
        self.token_max_age_s = token_max_age_s
        self.session_max_age_s = session_max_age_s
        self._clock = clock

    def issue_sign_in(self, uid: str, role: DashboardRole) -> str:
        if not uid or len(uid) > _MAX_UID_CHARS or not uid.isprintable():
            raise ValueError(f"uid must be 1-{_MAX_UID_CHARS} printable characters")
        return str(self._sign_in.dumps({"uid": uid, "role": role.value}))

    def exchange(self, token: str) -> tuple[DashboardSession, str]:
        """A fresh session and its cookie value for a valid sign-in token; SignInError otherwise."""
        data = self._load(self._sign_in, token.strip(), self.token_max_age_s)
        if data is None:
            raise SignInError("the sign-in token is not valid or has expired: mint a new one")
        uid, role = data
        session = DashboardSession(
            uid=uid, role=role, csrf_token=secrets.token_urlsafe(24),
            expires_at_s=self._clock() + self.session_max_age_s,
        )
        cookie = str(self._session.dumps({"uid": uid, "role": role.value, "csrf": session.csrf_token}))
        return session, cookie

    def session(self, cookie: str | None) -> DashboardSession | None:
        """The session a cookie carries, or None (absent, tampered, expired)."""
        if not cookie:
            return None
        try:
            data, issued_at = self._session.loads(cookie, max_age=self.session_max_age_s, return_timestamp=True)
        except BadData:
            return None
        checked = _fields(data)
        csrf = data.get("csrf") if isinstance(data, dict) else None
        if checked is None or not isinstance(csrf, str) or not csrf:
            return None
        return DashboardSession(
            uid=checked[0], role=checked[1], csrf_token=csrf,
            expires_at_s=float(issued_at.timestamp()) + self.session_max_age_s,
        )

    def _load(self, serializer: URLSafeTimedSerializer, value: str, max_age_s: int) -> tuple[str, DashboardRole] | None:
        try:
            data = serializer.loads(value, max_age=max_age_s)
        except BadData:
            return None
        return _fields(data)


def _fields(data: object) -> tuple[str, DashboardRole] | None:
    if not isinstance(data, dict):
        return None
    uid, role = data.get("uid"), data.get("role")
    if not isinstance(uid, str) or not uid or role not in {r.value for r in DashboardRole}:
        return None
    return uid, DashboardRole(role)


def csrf_matches(session: DashboardSession, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(session.csrf_token.encode(), sent.encode())
