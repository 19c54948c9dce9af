"""Authentication and the JSON error contract: 401, 413, 503, 404/405, catch-all 500, OpenAPI."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import pytest
from itsdangerous import TimestampSigner
from redis.asyncio import Redis

from app.auth import TokenSigner
from app.factory import create_app
from app.runtime import EXTENSION_KEY
from tests.app.conftest import MAX_BODY_BYTES, SECRET, Api, ics_with_events, make_settings
from tests.app.test_export_import import new_calendar


@pytest.mark.parametrize(
    ("authorization", "code"),
    [
        (None, "missing_token"),
        ("Bearer", "invalid_token"),
        ("Basic dXNlcjpwYXNz", "invalid_token"),
        ("Bearer not-a-token", "invalid_token"),
        ("Bearer " + TokenSigner("another-secret-key-0000", max_age_s=60).issue("mallory"), "invalid_token"),
    ],
    ids=["missing", "empty", "basic", "garbage", "other-key"],
)
async def test_missing_or_bad_token_is_401(api: Api, authorization: str | None, code: str) -> None:
    """Every endpoint needs a valid bearer token signed with AGENT_SECRET_KEY."""
    headers = {} if authorization is None else {"Authorization": authorization}
    for path in ("/jobs", "/calendars", "/jobs/abc"):
        response = await api.client.get(path, headers=headers)
        assert response.status_code == 401, path
        assert (await response.get_json())["error"] == code
        # RFC 9110 11.6.1 / RFC 6750 3.1: the challenge, with the error once a token was sent.
        challenge = "Bearer" if code == "missing_token" else 'Bearer error="invalid_token"'
        assert response.headers["WWW-Authenticate"] == challenge, path
    created = await api.client.post("/calendars", json={"name": "x"}, headers=headers)
    assert created.status_code == 401


async def test_expired_token_is_401(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token older than AGENT_TOKEN_MAX_AGE_SECONDS (12 h by default) is refused as expired."""
    issued_s = int(time.time()) - 13 * 3600
    with monkeypatch.context() as patch:
        patch.setattr(TimestampSigner, "get_timestamp", lambda self: issued_s)
        token = TokenSigner(SECRET, max_age_s=60).issue("alice")
    response = await api.client.get("/jobs", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert (await response.get_json())["error"] == "token_expired"


async def test_client_sent_user_id_is_ignored(api: Api, user: str, other_user: str) -> None:
    """A user id in the body or query is never trusted: the calendar belongs to the token's user."""
    response = await api.client.post("/calendars?user_uid=" + other_user, json={"name": "n"},
                                     headers={**api.headers(user), "X-User-Id": other_user})
    assert response.status_code == 201
    theirs = await (await api.client.get("/calendars", headers=api.headers(other_user))).get_json()
    assert theirs["calendars"] == []


async def test_body_over_the_limit_is_413(api: Api, user: str) -> None:
    """A body larger than AGENT_MAX_BODY_BYTES is a JSON 413 and enqueues nothing."""
    key = await new_calendar(api, user)
    big = ics_with_events(2000).encode()
    assert len(big) > MAX_BODY_BYTES
    response = await api.client.post(
        f"/calendars/{key}/import", data=big, headers={**api.headers(user), "Content-Type": "text/calendar"}
    )
    assert response.status_code == 413
    body = await response.get_json()
    assert body["error"] == "body_too_large" and str(MAX_BODY_BYTES) in body["message"]
    assert await api.runtime.client.list_for_user(user) == []


@pytest.fixture
async def api_without_redis(sqlite_url: str, namespace: str) -> AsyncIterator[Api]:
    app = create_app(make_settings(sqlite_url, namespace, redis_url="redis://127.0.0.1:1/15"))
    async with app.test_app() as test_app:
        yield Api(app=app, client=test_app.test_client(), runtime=app.extensions[EXTENSION_KEY])


async def test_redis_down_is_503_and_leaves_no_blob(api_without_redis: Api, user: str) -> None:
    """Redis unreachable: enqueue and reads answer 503; an upload saved before enqueue is deleted."""
    api = api_without_redis
    store = api.runtime.client.get_large_store()
    key = await new_calendar(api, user)
    before = set(await store.list_references(limit=100_000))
    for response in (
        await api.client.post(f"/calendars/{key}/export", headers=api.headers(user)),
        await api.client.post(f"/calendars/{key}/import", data=ics_with_events(1).encode(),
                              headers={**api.headers(user), "Content-Type": "text/calendar"}),
        await api.client.get("/jobs", headers=api.headers(user)),
        await api.client.get("/jobs/abc", headers=api.headers(user)),
        await api.client.get("/health"),
    ):
        assert response.status_code == 503
        assert (await response.get_json())["error"] == "queue_unavailable"
    assert set(await store.list_references(limit=100_000)) == before


async def test_unknown_route_and_method_are_json(api: Api, user: str) -> None:
    """Routing errors use the same JSON error shape."""
    missing = await api.client.get("/nope", headers=api.headers(user))
    assert missing.status_code == 404 and (await missing.get_json())["error"] == "not_found"
    wrong = await api.client.delete("/calendars", headers=api.headers(user))
    assert wrong.status_code == 405 and (await wrong.get_json())["error"] == "method_not_allowed"
    # RFC 9110 15.5.6: a 405 lists the methods the URL has (the JSON body must not lose the header).
    assert set(wrong.headers["Allow"].split(", ")) == {"GET", "HEAD", "OPTIONS", "POST"}


async def test_routing_errors_come_before_authentication(api: Api) -> None:
    """Without a token, an unknown URL is a 404 and a method the route lacks a 405, not a 401: the
    public OpenAPI document shows the routes anyway, and the public /health's 405 is no 401."""
    missing = await api.client.get("/nope")
    assert missing.status_code == 404 and (await missing.get_json())["error"] == "not_found"
    for method, path in (("TRACE", "/health"), ("PUT", "/jobs"), ("POST", "/jobs/abc")):
        wrong = await api.client.open(path, method=method)
        assert wrong.status_code == 405, (method, path)
        assert (await wrong.get_json())["error"] == "method_not_allowed"
        assert "Allow" in wrong.headers, (method, path)
    assert (await api.client.get("/jobs")).status_code == 401


async def test_unexpected_error_is_a_json_500_without_internals(
    api: Api, user: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug becomes a logged, opaque JSON 500: no traceback or message reaches the client."""

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(api.runtime.client, "list_for_user", broken)
    with caplog.at_level(logging.ERROR, logger="app.errors"):
        response = await api.client.get("/jobs", headers=api.headers(user))
    assert response.status_code == 500
    assert await response.get_json() == {"error": "internal_error", "message": "an unexpected error occurred"}
    assert "secret internal detail" in caplog.text


async def test_openapi_spec_and_docs_are_served(api: Api) -> None:
    """/openapi.json (no token needed) documents every endpoint, its schemas and the bearer scheme."""
    response = await api.client.get("/openapi.json")
    assert response.status_code == 200
    spec = await response.get_json()
    paths = spec["paths"]
    for path in ("/jobs", "/jobs/{job_id}", "/jobs/{job_id}/result", "/jobs/{job_id}/cancel", "/calendars",
                 "/calendars/{key}/events", "/calendars/{key}/export", "/calendars/{key}/import"):
        assert path in paths, path
    assert "requestBody" in paths["/calendars/{key}/events"]["post"]
    assert "202" in paths["/calendars/{key}/export"]["post"]["responses"]
    assert spec["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    docs = await api.client.get("/docs")
    assert docs.status_code == 200 and b"openapi.json" in await docs.get_data()


async def test_health_is_public(api: Api, redis: Redis) -> None:
    """GET /health needs no token and answers 200 while Redis is up (compose health check)."""
    response = await api.client.get("/health")
    assert response.status_code == 200 and await response.get_json() == {"status": "ok"}


def test_verified_token_cache_still_honours_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token is verified once and then served from a cache, but never past its expiry."""
    from app.errors import ApiError

    issued_s = int(time.time()) - 59
    with monkeypatch.context() as patch:
        patch.setattr(TimestampSigner, "get_timestamp", lambda self: issued_s)
        signer = TokenSigner("a-secret-key-for-cache-test", max_age_s=60)
        token = signer.issue("alice")
    assert signer.verify(token).uid == "alice"
    assert token in signer._verified
    time.sleep(2.1)  # itsdangerous counts whole seconds: 2 s guarantee an age over 60
    with pytest.raises(ApiError) as caught:
        signer.verify(token)
    assert caught.value.code == "token_expired"
