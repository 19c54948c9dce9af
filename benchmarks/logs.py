"""CPU cost per job of the structured logs, against the plain stdlib lines a worker wrote before.

Usage: PYTHONPATH=. python benchmarks/logs.py [--jobs N] [--rounds R]

Per simulated job, what one worker process logs at INFO, written to /dev/null:
- `plain` (the baseline, before agent_async.logs): arq's two per-job lines (`→ id:func(args)` with
  the payload's repr, `← id:func ●`) through the stdlib `%(asctime)s %(levelname)s %(name)s:
  %(message)s` formatter.
- `json` / `console`: `configure_logging(LogFormat.JSON / CONSOLE)`: the run's fields bound
  (`job_fields`), the worker's `job started` and `job finished` lines (fields, duration, outcome,
  redaction), and arq's two per-job lines, now dropped by the filter.
No Redis: on this shared 2-core machine a whole-worker figure moves by more than the logs cost, so
the cost is measured alone, in paired rounds (the setups in turn), median µs per job reported.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from agent_async.logs import JOB_FIELDS, LogFormat, configure_logging, job_fields, reset_logging

_ARQ = logging.getLogger("arq.worker")
_RUNNER = logging.getLogger("agent_async.worker.runner")
_REF = "agent:job:4d1c0f6f0b0e4f7c9f5e8f43f1f6a2b1:calendar.export.ics"
_ARGS = repr({"calendar_id": 42, "title": "Team calendar", "password": "x" * 12, "items": list(range(20))})


def _arq_lines() -> None:
    _ARQ.info("%6.2fs → %s(%s)%s", 0.004, _REF, _ARGS, "")
    _ARQ.info("%6.2fs ← %s ● %s", 0.001, _REF, "")


def _plain_job() -> None:
    _arq_lines()


def _structured_job() -> None:
    with job_fields(job_id="4d1c0f6f0b0e4f7c9f5e8f43f1f6a2b1", job="calendar.export.ics", user_uid="alice", attempt=1):
        _RUNNER.info("job started")
        _arq_lines()
        _RUNNER.info("job finished", extra={"duration_s": 0.0183, "outcome": "SUCCESS"})


def _setup(kind: str, sink: Any) -> Callable[[], None]:
    reset_logging()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for f in list(_ARQ.filters):
        _ARQ.removeFilter(f)
    if kind == "plain":
        handler = logging.StreamHandler(sink)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        return _plain_job
    configure_logging(LogFormat(kind), stream=sink)
    return _structured_job


def _us_per_job(job: Callable[[], None], jobs: int) -> float:
    started = time.perf_counter()
    for _ in range(jobs):
        job()
    return (time.perf_counter() - started) / jobs * 1e6


def main(args: argparse.Namespace, sink: Any) -> None:
    kinds = ("plain", "json", "console")
    costs: dict[str, list[float]] = {kind: [] for kind in kinds}
    _us_per_job(_setup("json", sink), 1000)  # warm-up
    for round_no in range(args.rounds):
        for kind in kinds:
            costs[kind].append(_us_per_job(_setup(kind, sink), args.jobs))
        print(f"round {round_no + 1}: " + ", ".join(f"{k} {costs[k][-1]:.1f} µs/job" for k in kinds))
    reset_logging()
    median = {kind: statistics.median(values) for kind, values in costs.items()}
    print(json.dumps({
        "jobs": args.jobs,
        "rounds": args.rounds,
        "fields": list(JOB_FIELDS),
        "plain_us_per_job": round(median["plain"], 1),
        "json_us_per_job": round(median["json"], 1),
        "console_us_per_job": round(median["console"], 1),
        "ratio_json_vs_plain": round(median["json"] / median["plain"], 3),
        "ratio_console_vs_plain": round(median["console"] / median["plain"], 3),
        "ratio_json_vs_plain_per_round": [round(j / p, 3) for j, p in zip(costs["json"], costs["plain"], strict=True)],
    }))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    with open(os.devnull, "w") as devnull:
        main(parser.parse_args(), devnull)
