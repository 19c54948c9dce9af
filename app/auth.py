"""Bearer tokens: signed with AGENT_SECRET_KEY by itsdangerous, carrying the user uid and an admin flag."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from itsdangerous import BadData, URLSafeTimedSerializer

from app.errors import ApiError

__all__ = ["CLOCK_SKEW_S", "Principal", "TokenSigner"]

# Separates these tokens from anything else signed with the same key.
_SALT = "agent-async.api-token.v1"
_MAX_UID_CHARS = 255
# Verified tokens remembered (least recently added dropped first).
_VERIFIED_CACHE_SIZE = 10_000
# A token dated up to this many seconds ahead of this server's clock is accepted: the process that
# issued it (another host, the CLI) may run a little ahead. Further ahead, it is not a valid token.
CLOCK_SKEW_S = 5


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller: the only source of a user id in the API."""

    uid: str
    admin: bool = False


class TokenSigner:
    """Issues and checks bearer tokens; expired, tampered or malformed tokens raise a 401 ApiError."""

    def __init__(self, secret_key: str, *, max_age_s: int, clock: Callable[[], float] = time.time) -> None:
        self._serializer = URLSafeTimedSerializer(
            secret_key, salt=_SALT, signer_kwargs={"digest_method": hashlib.sha256}
        )
        self.max_age_s = max_age_s
        self._clock = clock
        # token -> (principal, expiry): a client polls with the same token, so its HMAC check is
        # done once; the entry still expires when the token does.
        self._verified: OrderedDict[str, tuple[Principal, float]] = OrderedDict()

    def issue(self, uid: str, *, admin: bool = False) -> str:
        if not uid or len(uid) > _MAX_UID_CHARS or not uid.isprintable():
            raise ValueError(f"uid must be 1-{_MAX_UID_CHARS} printable characters")
        return self._serializer.dumps({"uid": uid, "adm": admin})

    def verify(self, token: str) -> Principal:
        cached = self._verified.get(token)
        if cached is not None and cached[1] > self._clock():
            return cached[0]
        principal, issued_at_s = self._verify_signature(token)
        self._verified[token] = (principal, issued_at_s + self.max_age_s)
        if len(self._verified) > _VERIFIED_CACHE_SIZE:
            self._verified.popitem(last=False)
        return principal

    def _verify_signature(self, token: str) -> tuple[Principal, float]:
        # The age is checked here, not by itsdangerous: it reports a token from the future as
        # SignatureExpired ("age < 0"), and with no allowance for clock skew at all.
        try:
            data, issued_at = self._serializer.loads(token, max_age=None, return_timestamp=True)
        except BadData:
            raise ApiError(401, "invalid_token", "the bearer token is not valid") from None
        issued_at_s = float(issued_at.timestamp())
        age_s = self._clock() - issued_at_s
        if age_s < -CLOCK_SKEW_S:
            raise ApiError(
                401, "invalid_token",
                f"the bearer token is not valid: it is dated {-age_s:.0f} s in the future (issued after "
                "this server's current time); check the clocks or get a new token",
            )
        if age_s > self.max_age_s:
            raise ApiError(401, "token_expired", "the bearer token has expired; get a new one")
        uid = data.get("uid") if isinstance(data, dict) else None
        if not isinstance(uid, str) or not uid:
            raise ApiError(401, "invalid_token", "the bearer token carries no user")
        return Principal(uid=uid, admin=data.get("adm") is True), issued_at_s

    def from_header(self, header: str | None) -> Principal:
        """The caller named by an `Authorization: Bearer <token>` header."""
        if not header:
            raise ApiError(401, "missing_token", "send Authorization: Bearer <token>")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "invalid_token", "the Authorization header must be 'Bearer <token>'")
        return self.verify(token.strip())
