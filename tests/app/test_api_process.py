"""The API process: the collector freeze once it serves (AGENT_API_GC_FREEZE)."""

from __future__ import annotations

import dataclasses
import gc

import pytest
from redis.asyncio import Redis

from agent_async.errors import ConfigurationError
from app.factory import create_app
from app.settings import AppSettings
from tests.app.conftest import make_settings
from tests.app.test_compose import compose


@pytest.mark.parametrize("freeze", [True, False])
async def test_the_api_takes_its_start_up_objects_out_of_the_collector_only_when_told(
    sqlite_url: str, namespace: str, redis: Redis, freeze: bool
) -> None:
    """A full collection would otherwise walk every object alive since start-up: a 50-70 ms stall of
    every request in flight about once a second under load (benchmarks/api.py)."""
    gc.unfreeze()
    app = create_app(dataclasses.replace(make_settings(sqlite_url, namespace), api_gc_freeze=freeze))
    async with app.test_app() as test_app:
        assert (gc.get_freeze_count() > 0) is freeze
        # It still serves: the health check reaches Redis.
        assert (await test_app.test_client().get("/health")).status_code == 200


def test_the_freeze_setting_is_read_and_checked() -> None:
    assert AppSettings.from_env({}).api_gc_freeze is False
    for raw, expected in (("true", True), (" ON ", True), ("1", True), ("false", False), ("off", False), ("", False)):
        assert AppSettings.from_env({"AGENT_API_GC_FREEZE": raw}).api_gc_freeze is expected, raw
    with pytest.raises(ConfigurationError, match="AGENT_API_GC_FREEZE='maybe': expected true or false"):
        AppSettings.from_env({"AGENT_API_GC_FREEZE": "maybe"})


def test_compose_runs_the_api_with_the_freeze_on() -> None:
    assert compose()["services"]["api"]["environment"]["AGENT_API_GC_FREEZE"] == "true"
