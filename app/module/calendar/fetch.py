"""Fetching an external ICS calendar without letting its URL reach the server's own network (SSRF).

The rules, applied to the subscribed URL and to every redirect (followed here, at most 5):

- only `http` and `https`, a host, no credentials, a port in 1..65535;
- the host is resolved (asyncio's getaddrinfo, bounded by the timeout) and **every** address it
  resolves to must be public: loopback, private, link-local (169.254.169.254, the cloud metadata
  address), multicast, reserved, unspecified and any other non-global address are refused, IPv4
  addresses mapped into IPv6 (`::ffff:10.0.0.1`) by the IPv4 address they carry;
- the connection goes to the address that was checked, never to a fresh resolution: the
  transport (`_PinnedTransport`) rewrites the request URL to that IP and keeps the `Host` header
  of the original URL (httpx sets it when the request is built), and for https passes the host
  name as the `sni_hostname` request extension, so TLS sends that SNI and verifies the
  certificate against the host name, not the IP. A DNS answer that changes between the check
  and the connection (DNS rebinding) therefore changes nothing;
- `AppSettings.fetch_allow_hosts` (`AGENT_FETCH_ALLOW_HOSTS`) names hosts (as written in the URL)
  or IP addresses allowed although they are not public; empty by default;
- no proxy from the environment (`trust_env=False`): a proxy would resolve the name itself;
- connect and read timeouts, plus a deadline on the whole fetch (3 x the timeout, redirects
  included), so a server trickling bytes cannot hold a worker;
- the body is streamed and abandoned past `max_bytes` (decoded size: a compressed bomb stops too);
- conditional GET: `If-None-Match` / `If-Modified-Since` from the previous sync's validators.

Errors are `FetchError`s whose message is safe to show to the calendar's owner (never an exception's
text, an internal address, a stack): `RetryableFetchError` (timeouts, connection failures, DNS
failures, 429, 5xx; a `GuardRetryable`, so a ConnectionGuard counts it) and `PermanentFetchError`
(a refused URL or address, another 4xx, too many redirects, too large, not an iCalendar file).
"""

from __future__ import annotations

import asyncio
import codecs
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import Enum
from typing import TYPE_CHECKING, ClassVar

import httpx

from agent_async import GuardRetryable

if TYPE_CHECKING:
    from app.settings import AppSettings

__all__ = [
    "MAX_REDIRECTS",
    "FetchError",
    "FetchErrorKind",
    "FetchPolicy",
    "FetchResult",
    "PermanentFetchError",
    "RetryableFetchError",
    "address_refusal",
    "check_url",
    "decode_ics",
    "fetch_ics",
    "parse_source_url",
]

MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_USER_AGENT = "agent-async-calendar/0.1 (+external ICS subscription)"
_ACCEPT = "text/calendar, text/plain;q=0.5, */*;q=0.1"
# The whole fetch (redirects included) may take this many times the connect/read timeout.
_TOTAL_FACTOR = 3


class FetchErrorKind(Enum):
    # Retryable: the server or the network may do better later.
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    RATE_LIMITED = "rate_limited"
    SERVER_ERROR = "server_error"
    # Permanent: the same request would fail the same way.
    INVALID_URL = "invalid_url"
    REFUSED_ADDRESS = "refused_address"
    HTTP_ERROR = "http_error"
    TOO_MANY_REDIRECTS = "too_many_redirects"
    TOO_LARGE = "too_large"
    NOT_ICALENDAR = "not_icalendar"


class FetchError(Exception):
    """A fetch that did not give a calendar; `str(error)` is the message stored on the calendar."""

    retryable: ClassVar[bool] = False

    def __init__(self, kind: FetchErrorKind, message: str) -> None:
        super().__init__(kind, message)
        self.kind = kind
        self.message = message

    def __str__(self) -> str:
        return self.message


class PermanentFetchError(FetchError):
    """Fails the sync at once (not retried)."""


class RetryableFetchError(FetchError, GuardRetryable):
    """Retried by the sync job; counted as a failure by the host's ConnectionGuard."""

    retryable: ClassVar[bool] = True

    def __init__(self, kind: FetchErrorKind, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(kind, message)
        self.args = (kind, message, retry_after_s)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class FetchPolicy:
    """What a fetch may do; built from AppSettings (`FetchPolicy.from_settings`)."""

    allow_hosts: frozenset[str] = frozenset()
    timeout_s: float = 10.0
    max_bytes: int = 5 * 1024 * 1024
    max_redirects: int = MAX_REDIRECTS

    @classmethod
    def from_settings(cls, settings: AppSettings) -> FetchPolicy:
        return cls(
            allow_hosts=frozenset(settings.fetch_allow_hosts),
            timeout_s=settings.fetch_timeout_s,
            max_bytes=settings.fetch_max_bytes,
        )

    def allows_host(self, host: str) -> bool:
        return host.lower() in self.allow_hosts

    def allows_address(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        if str(address) in self.allow_hosts:
            return True
        mapped = getattr(address, "ipv4_mapped", None)
        return mapped is not None and str(mapped) in self.allow_hosts


@dataclass(frozen=True, slots=True)
class FetchResult:
    """A 200 with its body (`body` is None and `not_modified` True for a 304)."""

    not_modified: bool
    body: bytes | None
    content_type: str | None
    etag: str | None
    last_modified: str | None


# --- URLs and addresses ----------------------------------------------------------------------------------


def parse_source_url(raw: str) -> httpx.URL:
    """The URL, normalised (host lower-cased, percent-encoded); PermanentFetchError naming what is wrong."""
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in raw):
        raise PermanentFetchError(FetchErrorKind.INVALID_URL, "the URL must not contain spaces or control characters")
    try:
        url = httpx.URL(raw)
    except (httpx.InvalidURL, ValueError, TypeError):
        raise PermanentFetchError(FetchErrorKind.INVALID_URL, "not a valid URL") from None
    if url.scheme not in ("http", "https"):
        raise PermanentFetchError(FetchErrorKind.INVALID_URL, "only http and https URLs are allowed")
    if not url.host:
        raise PermanentFetchError(FetchErrorKind.INVALID_URL, "the URL has no host")
    if url.userinfo:
        raise PermanentFetchError(FetchErrorKind.INVALID_URL, "credentials in the URL are not supported")
    if url.port is not None and not 1 <= url.port <= 65535:
        raise PermanentFetchError(FetchErrorKind.INVALID_URL, "the URL's port must be 1-65535")
    return url.copy_with(fragment=None)


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def address_refusal(address: IPAddress) -> str | None:
    """Why the address may not be fetched from ("a loopback address"...), or None if it is public."""
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        return address_refusal(mapped) or None
    for test, what in (
        ("is_unspecified", "an unspecified address"),
        ("is_loopback", "a loopback address"),
        ("is_link_local", "a link-local address"),
        ("is_multicast", "a multicast address"),
        ("is_private", "a private address"),
        ("is_reserved", "a reserved address"),
    ):
        if getattr(address, test):
            return what
    if not address.is_global:
        return "an address that is not publicly routable"
    return None


def _port(url: httpx.URL) -> int:
    return url.port or (443 if url.scheme == "https" else 80)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _resolve(host: str, port: int, timeout_s: float) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (TimeoutError, OSError, UnicodeError):
        # socket.gaierror is an OSError; a label too long for IDNA is a UnicodeError.
        raise RetryableFetchError(FetchErrorKind.CONNECTION, f"the host name {host} could not be resolved") from None
    addresses: list[IPAddress] = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise RetryableFetchError(FetchErrorKind.CONNECTION, f"the host name {host} could not be resolved")
    return addresses


async def resolve_checked(host: str, port: int, policy: FetchPolicy) -> IPAddress:
    """The address to connect to: every address the host resolves to must be allowed (one refused
    address refuses the host, so no retry can land on it)."""
    addresses = await _resolve(host, port, policy.timeout_s)
    if policy.allows_host(host):
        return addresses[0]
    literal = _is_ip(host)
    for address in addresses:
        why = None if policy.allows_address(address) else address_refusal(address)
        if why is not None:
            subject = f"the address {host} is" if literal else f"the host {host} resolves to"
            raise PermanentFetchError(
                FetchErrorKind.REFUSED_ADDRESS, f"{subject} {why}: only public addresses can be fetched"
            )
    return addresses[0]


async def check_url(raw: str, policy: FetchPolicy) -> httpx.URL:
    """Subscribe-time check: the URL parses and its host resolves to allowed addresses only."""
    url = parse_source_url(raw)
    await resolve_checked(url.host, _port(url), policy)
    return url


# --- the transport: connect to the checked address -----------------------------------------------------------


class _PinnedTransport(httpx.AsyncBaseTransport):
    """Checks each request's host (every redirect is a new request) and connects to the checked IP."""

    def __init__(self, policy: FetchPolicy, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self._policy = policy
        self._inner = inner if inner is not None else httpx.AsyncHTTPTransport(retries=0)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        host = url.host
        address = await resolve_checked(host, _port(url), self._policy)
        # The Host header was set from the original URL when the request was built; it stays.
        request.url = url.copy_with(host=str(address))
        if url.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": host}
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


# --- the fetch ------------------------------------------------------------------------------------------------


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _status_error(response: httpx.Response) -> FetchError:
    status = response.status_code
    reason = f"{status} {response.reason_phrase}".strip()
    if status == 429:
        retry_after = _retry_after(response.headers.get("Retry-After"))
        after = f", retry after {retry_after:.0f}s" if retry_after is not None else ""
        return RetryableFetchError(
            FetchErrorKind.RATE_LIMITED, f"the server is limiting requests ({reason}{after})", retry_after
        )
    if status >= 500 or status == 408:
        # A 503 may say when to come back, like a 429 (RFC 9110 section 10.2.3).
        retry_after = _retry_after(response.headers.get("Retry-After")) if status == 503 else None
        return RetryableFetchError(FetchErrorKind.SERVER_ERROR, f"the server answered {reason}", retry_after)
    if status in _REDIRECTS:
        return PermanentFetchError(FetchErrorKind.HTTP_ERROR, f"the server answered {reason} without a Location")
    return PermanentFetchError(FetchErrorKind.HTTP_ERROR, f"the server answered {reason}")


def _transport_error(exc: httpx.TransportError, timeout_s: float) -> FetchError:
    if isinstance(exc, httpx.TimeoutException):
        return RetryableFetchError(FetchErrorKind.TIMEOUT, f"the server did not answer within {timeout_s:g}s")
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return PermanentFetchError(FetchErrorKind.CONNECTION, "the server's TLS certificate could not be verified")
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, httpx.ConnectError):
        return RetryableFetchError(FetchErrorKind.CONNECTION, "could not connect to the server")
    return RetryableFetchError(FetchErrorKind.CONNECTION, "the connection to the server failed")


async def _read_limited(response: httpx.Response, max_bytes: int) -> bytes:
    too_large = PermanentFetchError(FetchErrorKind.TOO_LARGE, f"the calendar is larger than {max_bytes} bytes")
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def fetch_ics(
    raw_url: str, policy: FetchPolicy, *, etag: str | None = None, last_modified: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> FetchResult:
    """GET the calendar (conditionally when validators are given), following redirects safely."""
    url = parse_source_url(raw_url)
    headers = {"User-Agent": _USER_AGENT, "Accept": _ACCEPT}
    if etag:
        headers["If-None-Match"] = etag
    if last_modified:
        headers["If-Modified-Since"] = last_modified
    timeout = httpx.Timeout(policy.timeout_s)
    client = httpx.AsyncClient(
        transport=_PinnedTransport(policy, transport), timeout=timeout, follow_redirects=False, trust_env=False,
    )
    try:
        async with client, asyncio.timeout(policy.timeout_s * _TOTAL_FACTOR):
            for _hop in range(policy.max_redirects + 1):
                async with client.stream("GET", url, headers=headers) as response:
                    location = response.headers.get("Location")
                    if response.status_code in _REDIRECTS and location:
                        try:
                            url = parse_source_url(str(url.join(location)))
                            # Checked here for a clear message; the transport checks it again and
                            # connects to the address it checked.
                            await resolve_checked(url.host, _port(url), policy)
                        except PermanentFetchError as exc:
                            raise PermanentFetchError(exc.kind, f"redirected to a refused URL: {exc}") from None
                        continue
                    if response.status_code == 304:
                        return FetchResult(
                            not_modified=True, body=None, content_type=None,
                            etag=response.headers.get("ETag") or etag,
                            last_modified=response.headers.get("Last-Modified") or last_modified,
                        )
                    if response.status_code != 200:
                        raise _status_error(response)
                    content_type = response.headers.get("Content-Type")
                    if content_type and content_type.split(";", 1)[0].strip().lower() == "text/html":
                        raise PermanentFetchError(
                            FetchErrorKind.NOT_ICALENDAR, "the URL serves an HTML page, not an iCalendar file"
                        )
                    body = await _read_limited(response, policy.max_bytes)
                    return FetchResult(
                        not_modified=False, body=body, content_type=content_type,
                        etag=response.headers.get("ETag"), last_modified=response.headers.get("Last-Modified"),
                    )
            raise PermanentFetchError(
                FetchErrorKind.TOO_MANY_REDIRECTS, f"more than {policy.max_redirects} redirects"
            )
    except TimeoutError:
        raise RetryableFetchError(
            FetchErrorKind.TIMEOUT, f"the fetch took longer than {policy.timeout_s * _TOTAL_FACTOR:g}s"
        ) from None
    except httpx.TransportError as exc:
        raise _transport_error(exc, policy.timeout_s) from None
    except httpx.InvalidURL:
        raise PermanentFetchError(FetchErrorKind.INVALID_URL, "not a valid URL") from None


def decode_ics(body: bytes, content_type: str | None) -> str:
    """The body as text, in the charset its Content-Type names (UTF-8 by default, a BOM dropped)."""
    charset = None
    if content_type:
        for parameter in content_type.split(";")[1:]:
            name, _, value = parameter.partition("=")
            if name.strip().lower() == "charset":
                charset = value.strip().strip('"').lower() or None
    name = charset or "utf-8"
    try:
        codecs.lookup(name)
    except LookupError:
        raise PermanentFetchError(
            FetchErrorKind.NOT_ICALENDAR, f"the server declared an unknown charset {name!r}"
        ) from None
    if name in ("utf-8", "utf8"):
        name = "utf-8-sig"
    try:
        text = body.decode(name)
    except UnicodeDecodeError:
        raise PermanentFetchError(
            FetchErrorKind.NOT_ICALENDAR, f"the calendar is not valid {charset or 'UTF-8'} text"
        ) from None
    if "\x00" in text:
        raise PermanentFetchError(FetchErrorKind.NOT_ICALENDAR, "the calendar contains a NUL character")
    return text
