"""A worker process for the fault suite: `python -m tests.faults.worker` (settings from AGENT_*)."""

from __future__ import annotations

import asyncio
import logging
import os

import tests.faults.jobs  # noqa: F401  (registers the jobs)
from agent_async import Agent, AgentSettings


async def main() -> None:
    agent = Agent(AgentSettings.from_env())
    try:
        # arq owns SIGTERM: stop taking jobs, drain, hand back what is left. FAULT_WORKER_KIND=stock
        # runs arq's own Worker, as `arq module.WorkerSettings` does.
        await agent.run_worker(handle_signals=True, stock_worker=os.environ.get("FAULT_WORKER_KIND") == "stock")
    except asyncio.CancelledError:
        pass
    finally:
        await agent.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(name)s %(message)s")
    logging.getLogger("arq.worker").setLevel(logging.INFO)
    asyncio.run(main())
