"""GET /metrics in the reference app: its own bearer token (AGENT_METRICS_TOKEN), 404 while unset,
401 for a missing or wrong token (a user's signed token included), the exposition otherwise."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from quart import Quart
from redis.asyncio import Redis

from agent_async import ConfigurationError
from app.auth import TokenSigner
from app.factory import create_app
from app.settings import AppSettings
from tests.app.conftest import SECRET, make_settings

TOKEN = "metrics-token-0123456789abcdef"


@pytest.fixture
async def app(sqlite_url: str, namespace: str, redis: Redis) -> AsyncIterator[Quart]:
    quart_app = create_app(dataclasses.replace(make_settings(sqlite_url, namespace), metrics_token=TOKEN))
    async with quart_app.test_app():
        yield quart_app


async def test_the_right_token_gets_the_exposition(app: Quart) -> None:
    response = await app.test_client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain")
    names = {family.name for family in text_string_to_metric_families((await response.get_data()).decode())}
    assert {"agent_async_workers_alive", "agent_async_queue_depth", "agent_async_jobs_finished"} <= names


@pytest.mark.parametrize(
    ("authorization", "code"),
    [
        (None, "missing_token"),
        ("Bearer not-the-metrics-token-at-all", "invalid_token"),
        (f"Basic {TOKEN}", "invalid_token"),
        ("Bearer", "invalid_token"),
    ],
)
async def test_a_missing_or_wrong_token_is_refused(app: Quart, authorization: str | None, code: str) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = await app.test_client().get("/metrics", headers=headers)
    assert response.status_code == 401
    assert (await response.get_json())["error"] == code
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert TOKEN not in (await response.get_data()).decode()


async def test_a_user_token_is_not_a_metrics_token(app: Quart) -> None:
    admin = TokenSigner(SECRET, max_age_s=60).issue("someone", admin=True)
    response = await app.test_client().get("/metrics", headers={"Authorization": f"Bearer {admin}"})
    assert response.status_code == 401


async def test_without_a_token_setting_the_route_is_an_unknown_url(
    sqlite_url: str, namespace: str, redis: Redis
) -> None:
    quart_app = create_app(make_settings(sqlite_url, namespace))
    async with quart_app.test_app():
        client = quart_app.test_client()
        off = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        unknown = await client.get("/no-such-route")
        assert off.status_code == unknown.status_code == 404
        assert await off.get_json() == await unknown.get_json()


def test_the_token_setting_is_read_and_checked() -> None:
    env = {"AGENT_SECRET_KEY": SECRET, "AGENT_METRICS_TOKEN": f"  {TOKEN} "}
    assert AppSettings.from_env(env).metrics_token == TOKEN
    assert AppSettings.from_env({"AGENT_SECRET_KEY": SECRET}).metrics_token is None
    with pytest.raises(ConfigurationError, match="AGENT_METRICS_TOKEN") as raised:
        AppSettings.from_env({"AGENT_METRICS_TOKEN": "short-secret"})
    assert "short-secret" not in str(raised.value)
    assert TOKEN not in repr(AppSettings.from_env(env))
