"""compose.yaml heals and stops cleanly: restart policies, a per-replica worker health check, a
grace period longer than the drain, migrations once before the api and the workers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return loaded


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, duration
    return float(match.group(1))


def test_long_running_services_restart_and_the_migration_runs_once() -> None:
    services = compose()["services"]
    for name in ("redis", "postgres", "api", "worker"):
        assert services[name]["restart"] in ("unless-stopped", "always", "on-failure"), name
    assert services["migrate"]["restart"] == "no"
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name


def test_worker_health_is_its_own_heartbeat_not_a_shared_key() -> None:
    worker = compose()["services"]["worker"]
    test = worker["healthcheck"]["test"]
    assert test[:4] == ["CMD", "python", "-m", "agent_async"] and "healthcheck" in test, test
    assert "--check" not in test, "arq --check reads one key shared by every replica"
    assert worker["environment"]["AGENT_WORKER_HEARTBEAT_FILE"].startswith("/tmp/")
    assert worker["deploy"]["replicas"] >= 2


def test_docker_waits_longer_than_the_drain_before_sigkill() -> None:
    worker = compose()["services"]["worker"]
    drain_s = float(worker["environment"]["AGENT_SHUTDOWN_DRAIN_SECONDS"])
    assert seconds(worker["stop_grace_period"]) >= drain_s + 10


def test_the_worker_is_the_fast_one_that_survives_redis_restarts() -> None:
    assert compose()["services"]["worker"]["command"] == ["python", "-m", "app", "worker"]
