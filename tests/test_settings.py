"""AgentSettings: environment parsing and clear errors for bad values."""

from __future__ import annotations

import pytest

from agent_async import AgentSettings, ConfigurationError


def test_defaults_without_environment() -> None:
    s = AgentSettings.from_env({})
    assert s == AgentSettings()
    assert s.namespace == "agent" and s.poll_delay_s == 0.005


def test_every_variable_is_read() -> None:
    env = {
        "AGENT_REDIS_URL": "redis://cache:6380/2",
        "AGENT_NAMESPACE": "prod",
        "AGENT_STATE_RETENTION_SECONDS": "60",
        "AGENT_POLL_DELAY_SECONDS": "0.05",
        "AGENT_WORKER_MAX_JOBS": "3",
        "AGENT_JOB_PACKAGES": "app.module, plugins.module",
        "AGENT_DATABASE_URL": "postgresql+asyncpg://u@db/x",
    }
    s = AgentSettings.from_env(env)
    assert (s.redis_url, s.namespace, s.state_retention_s, s.poll_delay_s, s.worker_max_jobs) == (
        "redis://cache:6380/2",
        "prod",
        60,
        0.05,
        3,
    )
    assert s.job_packages == ("app.module", "plugins.module")
    assert s.database_url == "postgresql+asyncpg://u@db/x"
    assert set(AgentSettings.ENV) == {f for f in AgentSettings.__dataclass_fields__}


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("AGENT_WORKER_MAX_JOBS", "ten", "AGENT_WORKER_MAX_JOBS='ten': expected int"),
        ("AGENT_WORKER_MAX_JOBS", "0", "must be >= 1"),
        ("AGENT_NAMESPACE", "has space", "AGENT_NAMESPACE"),
        ("AGENT_REDIS_URL", "http://x", "AGENT_REDIS_URL"),
        ("AGENT_POLL_DELAY_SECONDS", "-1", "between 0 and 60"),
        ("AGENT_STORAGE_TYPE", "Not Valid", "AGENT_STORAGE_TYPE"),
        ("AGENT_DATABASE_URL", "nourl", "AGENT_DATABASE_URL"),
    ],
)
def test_bad_values_name_the_variable(var: str, value: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        AgentSettings.from_env({var: value})
    assert message in str(caught.value)


def test_password_in_redis_url_is_not_echoed() -> None:
    with pytest.raises(ConfigurationError) as caught:
        AgentSettings.from_env({"AGENT_REDIS_URL": "http://user:s3cret@host"})
    assert "s3cret" not in str(caught.value)


def test_urls_with_passwords_stay_out_of_repr() -> None:
    """Settings get logged; their URLs may carry passwords."""
    s = AgentSettings(redis_url="redis://:hunter2@cache:6379/0", database_url="postgresql+asyncpg://u:pw123@db/x")
    assert "hunter2" not in repr(s) and "pw123" not in repr(s)
