"""The service's side: enqueue reports and wait for them, as a web handler or a script would.

    python -m mysvc.service --count 3      (settings from AGENT_*; a worker must be running)

Prints one JSON object: each job's id, status and result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from agent_async import TERMINAL, Agent, AgentSettings, ClientAgent
from mysvc.jobs.reports import BuildReport


async def build_reports(count: int, timeout_s: float) -> dict[str, object]:
    async with Agent(AgentSettings.from_env()) as agent:
        client = ClientAgent(agent)
        ids = [await client.enqueue(BuildReport(title=f"report {i}", count=10_000 * (i + 1)), "alice")
               for i in range(count)]
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            states = [await client.get_state(job_id) for job_id in ids]
            if all(s is not None and s.status in TERMINAL for s in states):
                break
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"reports not done within {timeout_s}s: is a worker running?")
            await asyncio.sleep(0.05)
        return {s.job_id: {"status": s.status.value, "result": s.result} for s in states if s is not None}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m mysvc.service")
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=60)
    args = parser.parse_args()
    try:
        print(json.dumps(asyncio.run(build_reports(args.count, args.timeout_s)), sort_keys=True))
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


# The guard matters: run_in_child's forkserver imports the main module of the process that starts
# a child, and a script without it would run again there.
if __name__ == "__main__":
    sys.exit(main())
