"""The library's own commands, for any service that embeds it (settings from AGENT_*):

    python -m agent_async worker --jobs mysvc [--stock] [--burst]   run a worker for your jobs
    python -m agent_async healthcheck [--max-age-s N]              a worker's liveness (exit 0/1)
    python -m agent_async jobs list|show|cancel|retry, workers, queue, schedules, events [--follow]
                                                                    the operator's view (--json)

`worker` owns SIGINT and SIGTERM: it stops taking jobs, lets running ones finish for
AGENT_SHUTDOWN_DRAIN_SECONDS, hands the rest back (per `resume`) and exits 0, also while it waits
for an unreachable Redis. Exit status 2 is a usage or configuration error (one line on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from agent_async import ops
from agent_async.agent import Agent
from agent_async.client import ClientAgent
from agent_async.errors import ConfigurationError, QueueUnavailableError, RequestRefusedError
from agent_async.job import init_jobs
from agent_async.logs import configure_logging
from agent_async.settings import AgentSettings

__all__ = ["main"]

logger = logging.getLogger("agent_async.cli")

_USAGE_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m agent_async", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="run a job worker for the given job packages")
    worker.add_argument(
        "--jobs", action="append", default=[], metavar="PACKAGE",
        help="a package holding jobs/*.py or <module>/jobs/*.py (repeat it; default: AGENT_JOB_PACKAGES)",
    )
    worker.add_argument("--stock", action="store_true", help="arq's own Worker instead of the fast one")
    worker.add_argument("--burst", action="store_true", help="run the queued jobs, then exit")
    check = commands.add_parser("healthcheck", help="exit 0 if this container's worker is alive (its heartbeat file)")
    check.add_argument("--file", help="the heartbeat file (default: AGENT_WORKER_HEARTBEAT_FILE)")
    check.add_argument("--max-age-s", type=float, help="the oldest heartbeat that is alive (default: the lease)")
    ops.add_commands(commands)
    return parser


async def _run_worker(settings: AgentSettings, *, stock: bool, burst: bool) -> None:
    agent = Agent(settings)
    try:
        await agent.run_worker(stock_worker=stock, burst=burst)
    finally:
        await agent.close()


def _worker(args: argparse.Namespace, settings: AgentSettings) -> int:
    packages = tuple(p for arg in args.jobs for p in arg.split(",") if p) or settings.job_packages
    if not packages:
        raise ConfigurationError("name the packages of your jobs: --jobs PACKAGE or AGENT_JOB_PACKAGES")
    try:
        init_jobs(packages)
    except ModuleNotFoundError as exc:
        raise ConfigurationError(f"cannot import job package {exc.name!r}: {exc}") from None
    asyncio.run(_run_worker(settings, stock=args.stock, burst=args.burst))
    return 0


def _healthcheck(args: argparse.Namespace, settings: AgentSettings) -> int:
    name = args.file or settings.worker_heartbeat_file
    if not name:
        raise ConfigurationError("no heartbeat file: set AGENT_WORKER_HEARTBEAT_FILE (for the worker too), or --file")
    max_age_s = settings.lease_s if args.max_age_s is None else args.max_age_s
    try:
        age_s = time.time() - Path(name).stat().st_mtime
    except FileNotFoundError:
        print(f"unhealthy: no heartbeat file {name} (the worker has not started)", file=sys.stderr)
        return 1
    if age_s > max_age_s:
        print(f"unhealthy: the worker's last heartbeat is {age_s:.0f}s old (limit {max_age_s:g}s)", file=sys.stderr)
        return 1
    print(f"healthy: heartbeat {age_s:.1f}s ago")
    return 0


async def _operate(args: argparse.Namespace, settings: AgentSettings) -> int:
    async with Agent(settings) as agent:
        return await ops.run(args, ClientAgent(agent))


def _operator(args: argparse.Namespace, settings: AgentSettings) -> int:
    packages = tuple(p for arg in args.jobs for p in arg.split(",") if p) or settings.job_packages
    if packages:
        init_jobs(packages)
    try:
        return asyncio.run(_operate(args, settings))
    except (QueueUnavailableError, RequestRefusedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    level = logging.INFO if args.command in ("worker", "healthcheck") else logging.WARNING
    try:
        settings = AgentSettings.from_env()
        configure_logging(settings.log_format, level=level)
        if args.command == "worker":
            return _worker(args, settings)
        if args.command == "healthcheck":
            return _healthcheck(args, settings)
        return _operator(args, settings)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return _USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
