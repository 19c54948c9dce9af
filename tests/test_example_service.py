"""examples/mysvc end to end: the library's own worker command on a service's own job package."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REDIS_URL

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def example_env(namespace: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    # The library from this checkout, the service from examples/ (its own folder, as a user runs it).
    env.update({"AGENT_REDIS_URL": REDIS_URL, "AGENT_NAMESPACE": namespace, "PYTHONPATH": str(ROOT), **extra})
    return env


def test_the_library_worker_runs_a_service_of_its_own(namespace: str, redis: object, tmp_path: Path) -> None:
    beat = tmp_path / "alive"
    env = example_env(namespace, AGENT_SHUTDOWN_DRAIN_SECONDS="5", AGENT_WORKER_HEARTBEAT_FILE=str(beat))
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "agent_async", "worker", "--jobs", "mysvc"],
            cwd=EXAMPLES, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mysvc.service", "--count", "3", "--timeout-s", "60"],
            cwd=EXAMPLES, env=env, capture_output=True, text=True, timeout=90,
        )
        assert done.returncode == 0, done.stderr
        results = json.loads(done.stdout)
        assert len(results) == 3
        assert all(r["status"] == "SUCCESS" for r in results.values()), results
        totals = sorted(r["result"]["total"] for r in results.values())
        assert totals == sorted(sum(n * n for n in range(10_000 * (i + 1))) for i in range(3))
        # The live worker's heartbeat: the per-container health check passes.
        check = subprocess.run([sys.executable, "-m", "agent_async", "healthcheck"], env=env,
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stderr
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=20)
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text, text


def test_the_worker_command_says_what_is_missing(namespace: str) -> None:
    """No job package named: one line on stderr, exit status 2; a package with no jobs names where it looked."""
    env = example_env(namespace)
    done = subprocess.run([sys.executable, "-m", "agent_async", "worker"], cwd=EXAMPLES, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    expected = "error: name the packages of your jobs: --jobs PACKAGE or AGENT_JOB_PACKAGES"
    assert done.stderr.strip().splitlines() == [expected]
    done = subprocess.run([sys.executable, "-m", "agent_async", "worker", "--jobs", "mysvc.jobs"], cwd=EXAMPLES,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "looked for mysvc/jobs/jobs/*.py" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run([sys.executable, "-m", "agent_async", "worker", "--jobs", "nosuchsvc"], cwd=EXAMPLES,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot import job package 'nosuchsvc'" in done.stderr


def test_healthcheck_reads_the_heartbeat_file(namespace: str, tmp_path: Path) -> None:
    beat = tmp_path / "alive"
    env = example_env(namespace, AGENT_WORKER_HEARTBEAT_FILE=str(beat), AGENT_LEASE_SECONDS="3")
    check = [sys.executable, "-m", "agent_async", "healthcheck"]
    missing = subprocess.run(check, env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no heartbeat file" in missing.stderr
    beat.touch()
    fresh = subprocess.run(check, env=env, capture_output=True, text=True, timeout=60)
    assert fresh.returncode == 0, fresh.stderr
    ten_s_ago = time.time() - 10
    os.utime(beat, (ten_s_ago, ten_s_ago))
    stale = subprocess.run(check, env=env, capture_output=True, text=True, timeout=60)
    # At least the 10 s it was made stale by; a loaded machine may take a second or two longer.
    age = re.search(r"heartbeat is (\d+)s old \(limit 3s\)", stale.stderr)
    assert stale.returncode == 1 and age is not None and 10 <= int(age.group(1)) <= 20, stale.stderr
