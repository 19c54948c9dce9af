"""The operator's commands of `python -m agent_async`: jobs, workers, queue, schedules, events.

Each prints a table on a terminal, or JSON with `--json` (one document; `events --follow --json`
prints one JSON object per line).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from agent_async.client import ClientAgent
from agent_async.lifecycle import JobStatus
from agent_async.state import JobState

__all__ = ["add_commands", "run"]


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="JSON instead of a table")
    common.add_argument(
        "--jobs", action="append", default=[], metavar="PACKAGE",
        help="job packages to import (retry and schedules need the requests; default: AGENT_JOB_PACKAGES)",
    )
    return common


def add_commands(commands: Any) -> None:
    """Add the operator's subcommands to the CLI's subparsers."""
    common = _common()
    jobs = commands.add_parser("jobs", help="list, show, cancel or retry jobs").add_subparsers(
        dest="jobs_command", required=True
    )
    listing = jobs.add_parser("list", help="jobs of every user, newest first", parents=[common])
    listing.add_argument("--status", choices=[s.value for s in JobStatus])
    listing.add_argument("--job", help="a job name")
    listing.add_argument("--user", help="a user uid")
    listing.add_argument("--limit", type=int, default=50)
    for verb in ("show", "cancel", "retry"):
        jobs.add_parser(verb, help=f"{verb} one job", parents=[common]).add_argument("job_id")
    commands.add_parser("workers", help="the live worker processes", parents=[common])
    commands.add_parser("queue", help="queue depth and the wait of the oldest due job", parents=[common])
    commands.add_parser("schedules", help="the periodic jobs and their next runs (needs --jobs)", parents=[common])
    events = commands.add_parser("events", help="the latest job events, or --follow them", parents=[common])
    events.add_argument("--follow", action="store_true")
    events.add_argument("--job", dest="event_job", help="one job id")
    events.add_argument("--limit", type=int, default=50)


async def run(args: argparse.Namespace, client: ClientAgent, out: TextIO = sys.stdout) -> int:
    """Run one operator command; returns the exit status (1: not found, or refused)."""
    as_json = bool(args.json)
    if args.command == "jobs":
        return await _jobs(args, client, out, as_json)
    if args.command == "workers":
        rows = [w.to_dict() for w in await client.workers()]
        _print(out, as_json, rows, ["worker_id", "host", "pid", "jobs_running", "started_ms", "heartbeat_ms"])
    elif args.command == "queue":
        stats = await client.queue_stats()
        _print(out, as_json, [{"depth": stats.depth, "due": stats.due, "oldest_due_age_s": stats.oldest_due_age_s}],
               ["depth", "due", "oldest_due_age_s"])
    elif args.command == "schedules":
        views = [view.to_dict() for view in await client.schedules.views()]
        _print(out, as_json, views, ["name", "effective_cron", "enabled", "next_run", "disabled_reason"])
    elif args.command == "events":
        await _events(args, client, out, as_json)
    return 0


async def _jobs(args: argparse.Namespace, client: ClientAgent, out: TextIO, as_json: bool) -> int:
    columns = ["job_id", "name", "status", "user_uid", "attempts", "created_at", "error"]
    if args.jobs_command == "list":
        status = JobStatus(args.status) if args.status else None
        states = await client.list_jobs(status=status, name=args.job, user_uid=args.user, limit=args.limit)
        _print(out, as_json, [_row(s) for s in states], columns)
        return 0
    if args.jobs_command == "show":
        state = await client.get_state(args.job_id)
    elif args.jobs_command == "cancel":
        state = await client.cancel(args.job_id)
    else:
        new_id = await client.retry(args.job_id)
        state = None if new_id is None else await client.get_state(new_id)
    if state is None:
        print(f"error: no job {args.job_id}", file=sys.stderr)
        return 1
    _print(out, as_json, [_row(state, full=True)], [*columns, "retry_of", "finished_at"])
    return 0


async def _events(args: argparse.Namespace, client: ClientAgent, out: TextIO, as_json: bool) -> None:
    columns = ["id", "type", "job_id", "name", "status", "user_uid", "attempts", "error", "fraction", "message"]
    if not args.follow:
        events = await client.agent.events.latest(args.limit, job_id=args.event_job)
        _print(out, as_json, [e.to_dict() for e in events], columns)
        return
    async for event in client.events(job_id=args.event_job):
        if event is None:
            continue
        line = json.dumps(event.to_dict()) if as_json else "  ".join(_cell(event.to_dict().get(c)) for c in columns)
        print(line, file=out, flush=True)


def _row(state: JobState, *, full: bool = False) -> dict[str, Any]:
    row = state.to_dict()
    if not full:
        row.pop("payload", None)
        row.pop("result", None)
    return row


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and value > 10**12:  # epoch ms
        return datetime.fromtimestamp(value / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _print(out: TextIO, as_json: bool, rows: Sequence[dict[str, Any]], columns: list[str]) -> None:
    if as_json:
        print(json.dumps(list(rows), default=str, indent=2), file=out)
        return
    table = [[c.upper() for c in columns]] + [[_cell(row.get(c))[:60] for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip(), file=out)
    if not rows:
        print("(none)", file=out)
