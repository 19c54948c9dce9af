"""Metrics: counted by the transitions' own scripts in the namespace's hash, rendered as Prometheus text.

After a known workload (run by both worker kinds), the exposition shows exact counts; histograms
are cumulative with `_count` equal to the jobs that ran; no label value is an id; metrics off
writes nothing; the Lua bucket bounds are the Python ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from agent_async import (
    Agent,
    AgentSettings,
    ClientAgent,
    GroupFinalizer,
    Job,
    JobStatus,
    QueueUnavailableError,
    RequestRefusedError,
    agent_job,
)
from agent_async.guard import ConnectionGuard, GuardConfig
from agent_async.metrics import BUCKETS_S, render
from agent_async.metrics.collector import CONTENT_TYPE, MetricsSnapshot
from agent_async.metrics.layout import Field
from agent_async.store.scripts import lua_source, store_lib_constants
from agent_async.worker import JobRecovery
from tests.conftest import Drain, running_worker, wait_for_status
from tests.jobs import Boom, Echo, Flaky, Gated, NotResumable, Resumable, Sleeper
from tests.test_recovery import lose_worker

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: bytes) -> Samples:
    """Every sample of the exposition, keyed by (sample name, label set)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((f"agent_async_{name}", frozenset(labels.items())), 0.0)


# A worker also runs the schedules tests/jobs.py declares (tests.ticking, when a minute starts during
# a drain): the assertions look at the jobs each test queued, nothing else.
WORKLOAD = frozenset({"tests.echo", "tests.flaky", "tests.boom", "tests.gated", "tests.sleeper", "tests.resumable",
                      "tests.not_resumable"})


def by_job(samples: Samples, name: str) -> dict[str, float]:
    return {
        dict(labels)["job"]: v for (n, labels), v in samples.items()
        if n == f"agent_async_{name}" and dict(labels)["job"] in WORKLOAD
    }


def label_values(samples: Samples) -> set[str]:
    return {v for _, labels in samples for k, v in labels if k != "le"}


async def drain_until_terminal(drain: Drain, client: ClientAgent, job_ids: Iterable[str]) -> None:
    """A retry's backoff can outlast one burst: drain again until every job has ended."""
    pending = list(job_ids)
    for _ in range(10):
        await drain()
        states = [await client.get_state(job_id) for job_id in pending]
        pending = [j for j, s in zip(pending, states, strict=True) if s is None or not s.is_terminal]
        if not pending:
            return
        await asyncio.sleep(0.06)
    pytest.fail(f"jobs never ended: {pending}")


@dataclass
class MetricsFinal(GroupFinalizer):
    name: ClassVar[str] = "tests.metrics.final"


@agent_job
class MetricsFinalJob(Job[MetricsFinal]):
    request_class = MetricsFinal

    async def process(self, request: MetricsFinal, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        return {}


async def test_a_known_workload_gives_exact_counts(drain: Drain, agent: Agent, client: ClientAgent) -> None:
    user = f"user-{uuid.uuid4().hex}"
    ids = [await client.enqueue(Echo(text="hi"), user) for _ in range(3)]
    ids += [await client.enqueue(Flaky(fail_times=1), user), await client.enqueue(Boom(), user)]
    ids.append(await client.enqueue(Gated(), user))
    with pytest.raises(RequestRefusedError):
        await client.enqueue(Gated(), user)  # its one slot is taken: a gate rejection
    canceled = await client.enqueue(Echo(text="never"), user)
    assert (await client.cancel(canceled)) is not None
    await drain_until_terminal(drain, client, ids)

    samples = parse(await render(client))
    assert by_job(samples, "jobs_enqueued_total") == {"tests.echo": 4, "tests.flaky": 1, "tests.boom": 1,
                                                      "tests.gated": 1}
    finished = {(dict(k)["job"], dict(k)["status"]): v for (n, k), v in samples.items()
                if n == "agent_async_jobs_finished_total" and dict(k)["job"] in WORKLOAD}
    assert finished == {("tests.echo", "success"): 3, ("tests.echo", "canceled"): 1, ("tests.flaky", "success"): 1,
                        ("tests.boom", "failure"): 1, ("tests.gated", "success"): 1}
    assert by_job(samples, "job_retries_total") == {"tests.flaky": 1}
    assert by_job(samples, "gate_rejections_total") == {"tests.gated": 1}
    assert set(by_job(samples, "jobs_in_progress").values()) == {0}
    # Every job that ran is observed once, at its end; the one canceled before it started is not.
    assert by_job(samples, "job_duration_seconds_count") == {"tests.echo": 3, "tests.flaky": 1, "tests.boom": 1,
                                                             "tests.gated": 1}
    # Each start from the queue waited: the flaky job twice (its first run and its retry).
    assert by_job(samples, "job_queue_wait_seconds_count") == {"tests.echo": 3, "tests.flaky": 2, "tests.boom": 1,
                                                               "tests.gated": 1}
    assert value(samples, "queue_depth") == 0 and value(samples, "workers_alive") == 0
    assert not label_values(samples) & {*ids, canceled, user}, "an id or a user id is a label value"


async def test_histograms_are_cumulative_and_end_at_their_count(drain: Drain, client: ClientAgent) -> None:
    ids = [await client.enqueue(Echo()) for _ in range(4)]
    await drain_until_terminal(drain, client, ids)
    samples = parse(await render(client))
    for name in ("job_duration_seconds", "job_queue_wait_seconds"):
        buckets = sorted(
            ((float(dict(labels)["le"]), v) for (n, labels), v in samples.items()
             if n == f"agent_async_{name}_bucket" and dict(labels)["job"] == "tests.echo"),
        )
        assert [le for le, _ in buckets] == [*BUCKETS_S, float("inf")]
        counts = [v for _, v in buckets]
        assert counts == sorted(counts), f"{name}: buckets are not cumulative"
        assert counts[-1] == value(samples, f"{name}_count", job="tests.echo") == 4
        assert value(samples, f"{name}_sum", job="tests.echo") >= 0


async def test_the_lua_bounds_are_the_python_bounds_and_le_is_inclusive(redis: Redis, namespace: str) -> None:
    metrics_key = f"{namespace}:metrics"
    lib = lua_source("agent_async.store", "lib.lua", store_lib_constants(events_key="", metrics_key=metrics_key))
    bounds = await redis.eval(lib + "\nreturn BUCKETS_MS", 0)  # type: ignore[misc]
    assert bounds == [round(b * 1000) for b in BUCKETS_S]
    # 5 ms is in the 5 ms bucket (le is <=), 6 ms in the next, a day beyond the last bound.
    observations = "\nobserve('dur', 'j', 5) observe('dur', 'j', 6) observe('dur', 'j', 86400000)"
    await redis.eval(lib + observations, 0)  # type: ignore[misc]
    raw = await redis.hgetall(metrics_key)  # type: ignore[misc]
    fields = {k.decode(): int(v) for k, v in raw.items()}
    assert fields == {"dur_b|j|5": 1, "dur_b|j|10": 1, "dur_b|j|inf": 1, "dur_sum|j": 86400011}


async def test_metrics_off_write_no_hash(agent: Agent, redis: Redis, drain: Drain) -> None:
    async with Agent(dataclasses.replace(agent.settings, metrics_enabled=False)) as quiet:
        quiet_client = ClientAgent(quiet)
        job_id = await quiet_client.enqueue(Echo())
        await drain_until_terminal(lambda: _burst(quiet), quiet_client, [job_id])
        state = await quiet_client.get_state(job_id)
        assert state is not None and state.status is JobStatus.SUCCESS
        assert await redis.exists(quiet.keys.events), "the events stay on: only the counters are off"
        assert not await redis.exists(quiet.keys.metrics)
        samples = parse(await render(quiet_client))
        assert by_job(samples, "jobs_enqueued_total") == {}


async def _burst(agent: Agent) -> None:
    from agent_async import testing

    await testing.drain(agent)


async def test_recovered_jobs_are_counted_by_action(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    requeued = await client.enqueue(Resumable())
    failed = await client.enqueue(NotResumable())
    for job_id in (requeued, failed):
        await lose_worker(agent, redis, job_id)
    assert await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0) == 2
    samples = parse(await render(client))
    assert value(samples, "recovered_jobs_total", job="tests.resumable", action="requeued") == 1
    assert value(samples, "recovered_jobs_total", job="tests.not_resumable", action="failed") == 1
    assert value(samples, "jobs_finished_total", job="tests.not_resumable", status="failure") == 1
    # Both runs left STARTED: none is in progress any more.
    assert by_job(samples, "jobs_in_progress") == {"tests.resumable": 0, "tests.not_resumable": 0}


async def test_groups_finalized_by_outcome(drain: Drain, client: ClientAgent) -> None:
    ok = await client.enqueue_group([Echo(), Echo()], MetricsFinal())
    failed = await client.enqueue_group([Echo(), Boom()], MetricsFinal())
    for group_id in (ok, failed):
        view = await client.get_group(group_id)
        assert view is not None
        await drain_until_terminal(drain, client, [view.finalizer_job_id])
    samples = parse(await render(client))
    assert value(samples, "groups_finalized_total", status="succeeded") == 1
    assert value(samples, "groups_finalized_total", status="failed") == 1
    assert value(samples, "jobs_enqueued_total", job="tests.metrics.final") == 2
    assert value(samples, "jobs_enqueued_total", job="tests.echo") == 3


async def test_guard_requests_and_circuit_state(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    guard = ConnectionGuard(redis, namespace=agent.keys, default=GuardConfig(failure_threshold=1, cooldown_s=60))
    name = "ics:metrics.example.org"
    async with guard.request(name):
        pass
    with pytest.raises(OSError):
        async with guard.request(name):
            raise OSError("connection refused")
    with pytest.raises(Exception, match="cool"):
        async with guard.request(name):
            pass
    # The scripts derive the hash from the guard's key: it is KeySpace.metrics.
    assert await redis.hlen(agent.keys.metrics) == 3  # type: ignore[misc]
    samples = parse(await render(client, guard=guard))
    for result in ("ok", "fail", "refused_open"):
        assert value(samples, "guard_requests_total", guard=name, result=result) == 1, result
    assert value(samples, "guard_state", guard=name) == 2


async def test_gauges_read_at_scrape(client: ClientAgent) -> None:
    await client.enqueue(Echo(), defer_s=60)
    samples = parse(await render(client))
    assert value(samples, "queue_depth") == 1
    assert value(samples, "queue_oldest_age_seconds") == 0, "a deferred job is not due: nothing waits"
    assert CONTENT_TYPE.startswith("text/plain")


async def test_redis_down_is_queue_unavailable(settings: AgentSettings) -> None:
    """The API answers 503 for it (app/errors.py), never a 500 or an empty exposition."""
    async with Agent(dataclasses.replace(settings, redis_url="redis://127.0.0.1:1/0")) as down:
        with pytest.raises(QueueUnavailableError):
            await render(ClientAgent(down))


def test_counts_under_a_retired_bound_fold_into_the_next_one_up() -> None:
    """Bounds changed since a count was written: it joins the next bound; unknown fields are skipped."""
    snapshot = MetricsSnapshot.parse(
        {b"dur_b|j|7": b"2", b"dur_b|j|10": b"1", b"dur_b|j|7200001": b"1", b"dur_sum|j": b"30", b"later|x": b"9"}
    )
    histogram = snapshot.histograms[Field.DURATION_BUCKET]["j"]
    assert histogram.buckets_by_bound_ms == {10: 3, None: 1}
    assert histogram.sum_ms == 30
    assert all(not counts for counts in snapshot.counters.values())


async def test_jobs_in_progress_counts_the_runs_in_started(agent: Agent, client: ClientAgent) -> None:
    """Derived at scrape (starts less ends, retries and adjustments): two running, then none."""
    ids = [await client.enqueue(Sleeper(sleep_s=30), f"user-{n}") for n in range(2)]
    async with running_worker(agent):
        for job_id in ids:
            await wait_for_status(agent, job_id, JobStatus.STARTED)
        assert by_job(parse(await render(client)), "jobs_in_progress") == {"tests.sleeper": 2}
        for job_id in ids:
            await client.cancel(job_id, wait_s=5)
    samples = parse(await render(client))
    assert by_job(samples, "jobs_in_progress") == {"tests.sleeper": 0}
    assert value(samples, "jobs_finished_total", job="tests.sleeper", status="canceled") == 2
