"""Fault-injection fixtures: worker processes to kill, a private Redis to restart, and the figures."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Filled by the tests, printed once at the end of the run.
FIGURES: dict[str, Any] = {}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.write_line("fault-injection figures: " + json.dumps(FIGURES, sort_keys=True))


def fault_env(namespace: str, redis_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env.update(
        {
            "AGENT_REDIS_URL": redis_url,
            "AGENT_NAMESPACE": namespace,
            # Short leases and sweeps so a dead worker is noticed in about 2 s.
            "AGENT_LEASE_SECONDS": "1.2",
            "AGENT_RECONCILE_INTERVAL_SECONDS": "0.3",
            "AGENT_CANCEL_GRACE_SECONDS": "0.5",
            "AGENT_RETRY_BACKOFF_SECONDS": "0.01",
            "AGENT_SHUTDOWN_DRAIN_SECONDS": "2",
            "PYTHONPATH": str(ROOT),
            **extra,
        }
    )
    return env


class WorkerProcesses:
    """Starts `python -m tests.faults.worker` processes and kills them on demand."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        with open(self.log_dir / f"worker-{len(self.procs)}.log", "wb") as log:
            # The child keeps its own copy of the descriptor; ours can close at once.
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.worker"], env=self.env, cwd=ROOT, stdout=log, stderr=log
            )
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Any]:
    made: list[WorkerProcesses] = []

    def make(namespace: str, redis_url: str, **extra: str) -> WorkerProcesses:
        group = WorkerProcesses(fault_env(namespace, redis_url, **extra), tmp_path)
        made.append(group)
        return group

    yield make
    for group in made:
        group.stop_all()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """A redis-server of the test's own, on its own port, persisting to an append-only file so a
    restart keeps what was queued."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.data_dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        pytest.fail("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

