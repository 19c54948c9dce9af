"""What the benchmark scripts share: a worker run in a subprocess, and cleaning a namespace."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from redis.asyncio import Redis


def run_worker_subprocess(script: str, *args: str) -> dict[str, Any]:
    """Run `python script --worker ARGS` to completion; its last stdout line is a JSON object."""
    proc = subprocess.run(
        [sys.executable, script, "--worker", *args], capture_output=True, text=True, timeout=600, check=True
    )
    figures: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return figures


async def clean(redis: Redis, namespace: str) -> None:
    """Delete a namespace's keys and arq's per-job keys of its engine job ids."""
    for pattern in (f"{namespace}:*", f"arq:*:{namespace}:*"):
        keys = [k async for k in redis.scan_iter(match=pattern, count=5000)]
        for i in range(0, len(keys), 5000):
            await redis.delete(*keys[i:i + 5000])
