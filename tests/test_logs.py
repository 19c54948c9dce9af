"""Structured logs (agent_async.logs): the fields bound per run, the start and end lines, arq's lines
through the same formatter, redaction, the AGENT_LOG_FORMAT setting, and a real worker process."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import structlog

from agent_async import Agent, AgentSettings, ClientAgent, ConfigurationError, Job, JobRequest, JobStatus, agent_job
from agent_async.logs import (
    ARQ_CLI_LOG_CONFIG,
    JOB_FIELDS,
    EngineJobLineFilter,
    LogFormat,
    configure_logging,
    redact,
    reset_logging,
)
from tests.conftest import REDIS_URL, Drain, running_worker, wait_for_status
from tests.jobs import Boom, Flaky, Sleeper, Slow

ROOT = Path(__file__).resolve().parent.parent

# A value of the payload that must appear in no line (arq's start line prints job arguments).
SECRET = "pa55-w0rd-in-the-payload"

Lines = Callable[[], list[dict[str, Any]]]


@dataclass
class Logged(JobRequest):
    name: ClassVar[str] = "tests.logs.logged"
    password: str = ""
    note: str = ""


@agent_job
class LoggedJob(Job[Logged]):
    request_class = Logged

    async def process(self, request: Logged, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        # A job's own lines, through the stdlib and through structlog: both carry the run's fields.
        logging.getLogger("tests.logs.job").info("inside process: %s", request.note)
        structlog.get_logger("tests.logs.job").info("structlog inside process", step=2)
        return {"ok": True, "password": request.password}


@pytest.fixture
def json_lines() -> Iterator[Lines]:
    """JSON logging to a captured stream; the lines parsed (every line must be JSON)."""
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    configure_logging(LogFormat.JSON, stream=stream)

    def lines() -> list[dict[str, Any]]:
        text = stream.getvalue()
        assert SECRET not in text, "a payload value reached the log"
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    try:
        yield lines
    finally:
        reset_logging()
        root.setLevel(level)


def run_lines(lines: list[dict[str, Any]], job_id: str) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("job_id") == job_id]


def events(lines: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["event"] == event]


async def test_every_line_of_a_run_carries_its_fields_and_start_end_lines_are_written(
    drain: Drain, client: ClientAgent, json_lines: Lines
) -> None:
    job_id = await client.enqueue(Logged(password=SECRET, note="hello"), "alice")
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.SUCCESS
    lines = json_lines()
    mine = run_lines(lines, job_id)
    assert [line["event"] for line in mine] == [
        "job started", "inside process: hello", "structlog inside process", "job finished",
    ]
    for line in mine:
        assert {k: line[k] for k in JOB_FIELDS} == {
            "job_id": job_id, "job": Logged.name, "user_uid": "alice", "attempt": 1,
        }, line
        assert line["level"] == "info"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", line["timestamp"]), line["timestamp"]
    assert mine[2]["step"] == 2 and mine[1]["logger"] == "tests.logs.job"
    finished = mine[-1]
    assert finished["outcome"] == "SUCCESS" and "error_type" not in finished
    assert isinstance(finished["duration_s"], float) and 0 <= finished["duration_s"] < 10
    # arq's own lines (worker start, its summary) went through the same JSON formatter.
    assert any(line["logger"].startswith("arq.") for line in lines), lines
    # The fields do not leak past the run.
    assert all("job_id" not in line for line in lines if line["event"].startswith("Starting worker"))


async def test_a_retried_job_logs_each_attempt_with_its_number(
    drain: Drain, client: ClientAgent, json_lines: Lines
) -> None:
    job_id = await client.enqueue(Flaky(fail_times=1), "bob")
    await drain()
    mine = run_lines(json_lines(), job_id)
    finished = events(mine, "job finished")
    assert [(line["attempt"], line["outcome"]) for line in finished] == [(1, "RETRY"), (2, "SUCCESS")]
    assert finished[0]["error_type"] == "ValueError"
    assert [line["attempt"] for line in events(mine, "job started")] == [1, 2]


async def test_a_failing_job_end_line_says_the_outcome_and_the_error_type_only(
    drain: Drain, client: ClientAgent, json_lines: Lines
) -> None:
    job_id = await client.enqueue(Boom())
    await drain()
    mine = run_lines(json_lines(), job_id)
    (finished,) = events(mine, "job finished")
    assert finished["outcome"] == "FAILURE" and finished["error_type"] == "RuntimeError"
    assert finished["user_uid"] is None and finished["job"] == Boom.name
    # The message of the exception is on the warning line (with its traceback), not on the end line.
    assert "not retryable" not in json.dumps(finished)
    (warning,) = [line for line in mine if line["level"] == "warning"]
    assert "RuntimeError: boom: not retryable" in warning["exception"]


async def test_a_run_stopped_at_its_soft_limit_ends_with_that_error_type(
    drain: Drain, client: ClientAgent, json_lines: Lines
) -> None:
    job_id = await client.enqueue(Slow(sleep_s=5))
    await drain()
    (finished,) = events(run_lines(json_lines(), job_id), "job finished")
    assert (finished["outcome"], finished["error_type"]) == ("FAILURE", "SoftTimeLimitExceeded")
    assert finished["duration_s"] >= Slow.soft_timeout_seconds


async def test_a_canceled_run_and_a_run_cut_by_worker_shutdown_say_so_in_their_end_line(
    agent: Agent, client: ClientAgent, json_lines: Lines
) -> None:
    async with running_worker(agent):
        canceled_id = await client.enqueue(Sleeper(), "u")
        await wait_for_status(agent, canceled_id, JobStatus.STARTED)
        await client.cancel(canceled_id)
        interrupted_id = await client.enqueue(Sleeper(), "u")
        await wait_for_status(agent, interrupted_id, JobStatus.STARTED)
    lines = json_lines()
    (canceled,) = events(run_lines(lines, canceled_id), "job finished")
    assert canceled["outcome"] == "CANCELED" and "error_type" not in canceled
    (interrupted,) = events(run_lines(lines, interrupted_id), "job finished")
    assert (interrupted["outcome"], interrupted["error_type"]) == ("INTERRUPTED", "WorkerShutdown")
    assert interrupted["attempt"] == 1 and interrupted["user_uid"] == "u"


async def test_without_configure_logging_the_worker_still_drops_arqs_argument_lines(
    drain: Drain, client: ClientAgent, caplog: pytest.LogCaptureFixture
) -> None:
    engine_logger = logging.getLogger("arq.worker")
    for f in list(engine_logger.filters):
        engine_logger.removeFilter(f)  # as in a fresh process: the worker's start-up installs it
    job_id = await client.enqueue(Logged(password=SECRET, note="plain"))
    with caplog.at_level(logging.INFO):
        await drain()
    messages = [record.getMessage() for record in caplog.records]
    assert "inside process: plain" in messages and "job finished" in messages
    assert not any(SECRET in m for m in messages), messages
    assert not any(job_id in m for m in messages if m.startswith(" ")), "arq's per-job lines are dropped"
    assert any(m.startswith("Starting worker") for m in messages), "arq's other lines are kept"


def test_engine_per_job_lines_are_dropped_and_its_warnings_kept() -> None:
    """arq's start line prints `id:func(args...)`: dropped (with the other per-job INFO lines)."""
    keep = EngineJobLineFilter().filter

    def record(level: int, msg: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord("arq.worker", level, __file__, 1, msg, args, None)

    assert not keep(record(logging.INFO, "%6.2fs → %s(%s)%s", 0.1, "ns:1:job", f"{{'password': '{SECRET}'}}", ""))
    assert not keep(record(logging.INFO, "%6.2fs ← %s ● %s", 0.1, "ns:1:job", "'result'"))
    assert keep(record(logging.WARNING, "%6.2fs ! %s max retries %d exceeded", 0.1, "ns:1:job", 5))
    assert keep(record(logging.INFO, "Starting worker for %d functions: %s", 2, "a, b"))


def test_redaction_masks_secret_keys_url_passwords_and_bearer_tokens() -> None:
    event = {
        "event": "connecting to redis://user:hunter2@cache:6379/0 with Bearer abc.def.ghi",
        "header": "BEARER xyz",
        "password": "hunter2",
        "api_token": "t0k3n",
        "Authorization": "Basic dXNlcjpwYXNz",
        "headers": {"cookie": "sid=1", "accept": "json"},
        "url": "postgresql+asyncpg://app:s3cret@db/app",
        "job_id": "j1",
        "count": 3,
    }
    out = redact(None, "info", dict(event))
    assert out["event"] == "connecting to redis://user:***@cache:6379/0 with Bearer ***"
    assert out["password"] == out["api_token"] == out["Authorization"] == "***"
    assert out["headers"] == {"cookie": "***", "accept": "json"}
    assert out["url"] == "postgresql+asyncpg://app:***@db/app"
    assert out["job_id"] == "j1" and out["count"] == 3 and out["header"] == "BEARER ***"


def test_stdlib_lines_are_redacted_in_the_rendered_output(json_lines: Lines) -> None:
    logger = logging.getLogger("tests.logs.redact")
    try:
        raise RuntimeError("could not reach redis://:hunter2@cache:6379")
    except RuntimeError:
        logger.exception("failed with %s", "redis://u:hunter2@cache", extra={"secret_key": "k"})
    (line,) = [line for line in json_lines() if line["logger"] == "tests.logs.redact"]
    assert "hunter2" not in json.dumps(line)
    assert line["event"] == "failed with redis://u:***@cache" and line["secret_key"] == "***"
    assert "RuntimeError: could not reach redis://:***@cache:6379" in line["exception"]


def test_console_format_renders_the_fields_on_one_line() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    configure_logging(LogFormat.CONSOLE, stream=stream)
    try:
        with structlog.contextvars.bound_contextvars(job_id="j-42", job="x.y", user_uid="u", attempt=1):
            logging.getLogger("tests.logs.console").warning("console line %d", 7)
    finally:
        reset_logging()
        root.setLevel(level)
    (text,) = stream.getvalue().splitlines()
    assert "console line 7" in text and "job_id=j-42" in text and "attempt=1" in text
    assert "[warning" in text and "\x1b[" not in text, "no colours when the stream is not a terminal"
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_log_format_setting_reads_json_and_console_and_refuses_anything_else() -> None:
    assert AgentSettings().log_format is LogFormat.CONSOLE
    assert AgentSettings.from_env({"AGENT_LOG_FORMAT": "json"}).log_format is LogFormat.JSON
    assert AgentSettings.from_env({"AGENT_LOG_FORMAT": " Console "}).log_format is LogFormat.CONSOLE
    with pytest.raises(ConfigurationError, match=r"AGENT_LOG_FORMAT='xml': expected one of console, json"):
        AgentSettings.from_env({"AGENT_LOG_FORMAT": "xml"})
    with pytest.raises(ConfigurationError, match="AGENT_LOG_FORMAT"):
        AgentSettings(log_format="json")  # type: ignore[arg-type]


def test_arq_cli_log_config_changes_nothing() -> None:
    """`arq ... --custom-log-dict agent_async.logs.ARQ_CLI_LOG_CONFIG` leaves our handler alone."""
    import logging.config

    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging(LogFormat.JSON, stream=stream)
    try:
        logging.config.dictConfig(ARQ_CLI_LOG_CONFIG)
        assert handler in root.handlers and logging.getLogger("arq").handlers == []
        logging.getLogger("arq.worker").info("Starting worker for %d functions", 1)
    finally:
        reset_logging()
        root.setLevel(level)
    assert json.loads(stream.getvalue())["event"] == "Starting worker for 1 functions"


def test_a_worker_start_up_removes_the_handler_arqs_cli_added() -> None:
    """`arq app.worker.WorkerSettings` without the flag: arq's CLI adds its own handler after our
    configure_logging; the worker's start-up removes it, so arq's lines are written once."""
    from arq.logs import default_log_config

    from agent_async.logs import silence_engine_job_lines

    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    arq_logger = logging.getLogger("arq")
    configure_logging(LogFormat.JSON, stream=stream)
    try:
        # What arq's dictConfig does (not run here: a full dictConfig closes every handler, pytest's too).
        (name,) = default_log_config(verbose=False)["loggers"]["arq"]["handlers"]
        cli_handler = logging.StreamHandler(io.StringIO())
        cli_handler.set_name(name)
        arq_logger.addHandler(cli_handler)
        silence_engine_job_lines()
        assert arq_logger.handlers == []
        logging.getLogger("arq.worker").info("recording health: %s", "j_complete=1")
    finally:
        reset_logging()
        root.setLevel(level)
        for handler in list(arq_logger.handlers):
            arq_logger.removeHandler(handler)
        arq_logger.setLevel(logging.NOTSET)
    assert json.loads(stream.getvalue())["event"] == "recording health: j_complete=1"


# -- a real worker process -----------------------------------------------------------------------

LOGSVC_JOB = '''
"""logsvc.jobs.logged: logs from process() and from a child process."""

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from agent_async import Job, JobRequest, agent_job, run_in_child


def in_child(count: int) -> int:
    logging.getLogger("logsvc.child").info("in the child process")
    return count * 2


@dataclass
class Logged(JobRequest):
    name: ClassVar[str] = "logsvc.logged"
    password: str = ""
    count: int = 1


@agent_job
class LoggedJob(Job[Logged]):
    request_class = Logged

    async def process(self, request: Logged, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        logging.getLogger("logsvc.job").info("inside process")
        return {"doubled": await run_in_child(in_child, request.count)}
'''


@dataclass
class ServiceLogged(JobRequest):
    """The request of logsvc.logged, as the enqueuing side declares it (the worker imports its own)."""

    name: ClassVar[str] = "logsvc.logged"
    password: str = ""
    count: int = 1


@pytest.mark.slow
async def test_a_worker_process_writes_json_lines_with_the_fields_also_from_a_child(
    agent: Agent, client: ClientAgent, namespace: str, tmp_path: Path
) -> None:
    jobs = tmp_path / "logsvc" / "jobs"
    jobs.mkdir(parents=True)
    (tmp_path / "logsvc" / "__init__.py").write_text("")
    (jobs / "__init__.py").write_text("")
    (jobs / "logged.py").write_text(textwrap.dedent(LOGSVC_JOB))
    job_id = await client.enqueue(ServiceLogged(password=SECRET, count=21), "carol")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env.update({
        "AGENT_REDIS_URL": REDIS_URL, "AGENT_NAMESPACE": namespace, "AGENT_LOG_FORMAT": "json",
        "AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/agent.db",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    })
    # In a thread: the event loop of this test stays free (the Agent's pool lives on it).
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "agent_async", "worker", "--jobs", "logsvc", "--burst"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90,
    )
    assert done.returncode == 0, done.stderr
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.SUCCESS and state.result == {"doubled": 42}
    assert SECRET not in done.stderr + done.stdout
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    mine = run_lines(lines, job_id)
    assert [line["event"] for line in mine] == [
        "job started", "inside process", "in the child process", "job finished",
    ], done.stderr
    assert all((line["job"], line["user_uid"], line["attempt"]) == ("logsvc.logged", "carol", 1) for line in mine)
    assert mine[-1]["outcome"] == "SUCCESS" and isinstance(mine[-1]["duration_s"], float)
    assert any(line["logger"] == "arq.worker" for line in lines), done.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.slow
def test_the_api_process_writes_json_lines_and_hypercorn_logs_once(namespace: str, tmp_path: Path) -> None:
    """`python -m app api`: hypercorn's own lines go through the same JSON handler, not through a
    second handler of hypercorn's (app/hypercorn_config.py)."""
    from tests.app.conftest import SECRET as APP_SECRET

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env.update({
        "AGENT_REDIS_URL": REDIS_URL, "AGENT_NAMESPACE": namespace, "AGENT_LOG_FORMAT": "json",
        "AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/app.db", "AGENT_SECRET_KEY": APP_SECRET,
    })
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "api", "--port", str(port)],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        for _ in range(400):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                    assert answer.status == 200
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError("the API did not start")
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    running = [line for line in lines if line["event"].startswith("Running on")]
    assert [line["logger"] for line in running] == ["hypercorn.error"], stderr
    assert any(line["logger"] == "app" and line["event"].startswith("API on") for line in lines), stderr
    assert APP_SECRET not in stderr
