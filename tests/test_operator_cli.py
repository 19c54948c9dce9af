"""The operator's commands of `python -m agent_async`, against a real Redis, --json parsed back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_async import Agent, AgentSettings, ClientAgent, JobStatus
from tests.conftest import REDIS_URL
from tests.faults.svc.jobs.sleep import Sleep

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def cli(namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env.update({"AGENT_REDIS_URL": REDIS_URL, "AGENT_NAMESPACE": namespace, "PYTHONPATH": str(ROOT)})
    return subprocess.run([sys.executable, "-m", "agent_async", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def cli_json(namespace: str, *args: str) -> Any:
    done = cli(namespace, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_jobs_queue_events_cancel_and_retry(settings: AgentSettings, redis: object, namespace: str) -> None:
    async with Agent(settings) as agent:
        client = ClientAgent(agent)
        first = await client.enqueue(Sleep(duration_s=1), "alice")
        second = await client.enqueue(Sleep(duration_s=2), "bob")

        listed = cli_json(namespace, "jobs", "list")
        assert [row["job_id"] for row in listed] == [second, first]
        assert [row["job_id"] for row in cli_json(namespace, "jobs", "list", "--user", "alice")] == [first]
        assert cli_json(namespace, "jobs", "list", "--status", "SUCCESS") == []
        [shown] = cli_json(namespace, "jobs", "show", first)
        assert shown["payload"] == {"duration_s": 1} and shown["status"] == "PENDING"

        [queue] = cli_json(namespace, "queue")
        assert queue["depth"] == 2 and queue["due"] == 2 and queue["oldest_due_age_s"] >= 0

        [cancelled] = cli_json(namespace, "jobs", "cancel", first)
        assert cancelled["status"] == "CANCELED"
        [retried] = cli_json(namespace, "jobs", "retry", first, "--jobs", "tests.faults.svc")
        assert retried["retry_of"] == first and retried["status"] == "PENDING" and retried["job_id"] != first
        new_state = await client.get_state(retried["job_id"])
        assert new_state is not None and new_state.user_uid == "alice" and new_state.payload == {"duration_s": 1}

        events = cli_json(namespace, "events")
        assert [(e["job_id"], e["status"]) for e in events][:3] == [
            (first, "PENDING"), (second, "PENDING"), (first, "CANCELED"),
        ]
        assert cli_json(namespace, "workers") == []
        table = cli(namespace, "jobs", "list")
        assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:3] == ["JOB_ID", "NAME", "STATUS"]
        state = await client.get_state(second)
        assert state is not None and state.status is JobStatus.PENDING, "listing changed nothing"


def test_unknown_jobs_and_refused_retries_are_one_line_errors(namespace: str, redis: object) -> None:
    missing = cli(namespace, "jobs", "show", "nope")
    assert missing.returncode == 1 and missing.stderr.strip() == "error: no job nope"
    refused = cli(namespace, "jobs", "retry", "nope")
    assert refused.returncode == 1 and "no job nope" in refused.stderr
