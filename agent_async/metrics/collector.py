"""The Prometheus exposition of one namespace: the scripts' counters from Redis, gauges read at scrape.

Why Redis and not prometheus-client's multiprocess mode: workers are separate processes, often in
separate containers or hosts that share no directory (and whose pids collide across containers);
a per-worker endpoint would need a scrape target per replica and lose the counts of a SIGKILLed
worker. The store's scripts count inside the transition itself (agent_async.metrics.layout), so
any process that reaches Redis (the API) serves the sum of every worker, exactly.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from agent_async.guard import CircuitState
from agent_async.lifecycle import now_ms
from agent_async.metrics.layout import BUCKETS_S, INF_BOUND, Field, bucket_bounds_ms
from agent_async.store.jobs import _reachable

if TYPE_CHECKING:
    from agent_async.client import ClientAgent
    from agent_async.engine import QueueStats
    from agent_async.guard import ConnectionGuard

__all__ = ["CONTENT_TYPE", "GUARD_STATE_VALUES", "PREFIX", "MetricsSnapshot", "guard_states", "render"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
PREFIX = "agent_async_"
# guard_state's values, ordered by severity (an alert can say `>= 1`); not the Lua scripts' codes.
GUARD_STATE_VALUES: Mapping[CircuitState, int] = {
    CircuitState.CLOSED: 0, CircuitState.HALF_OPEN: 1, CircuitState.OPEN: 2,
}

_Labels = tuple[str, ...]


@dataclass(slots=True)
class _Histogram:
    buckets_by_bound_ms: dict[int | None, int] = field(default_factory=dict)  # None: +Inf
    sum_ms: int = 0


@dataclass(slots=True)
class MetricsSnapshot:
    """The metrics hash parsed: each field's prefix, its label values, its value."""

    counters: dict[Field, dict[_Labels, int]] = field(default_factory=lambda: defaultdict(dict))
    histograms: dict[Field, dict[str, _Histogram]] = field(default_factory=lambda: defaultdict(dict))

    @classmethod
    def parse(cls, raw: Mapping[bytes | str, bytes | str]) -> MetricsSnapshot:
        snapshot = cls()
        kinds = {f.value: f for f in Field}
        for key, value in raw.items():
            name = key.decode() if isinstance(key, bytes) else key
            prefix, _, rest = name.partition("|")
            kind = kinds.get(prefix)
            if kind is None:
                continue  # a field of a later version: ignored, not a scrape failure
            snapshot._add(kind, rest, int(value))
        return snapshot

    def in_progress(self) -> dict[str, int]:
        """Runs in STARTED per job: starts from the queue (the wait histogram's count) less the runs
        that ended (the duration histogram's count), retries and the adjustments (layout.Field)."""
        def count(kind: Field, job: str) -> int:
            histogram = self.histograms[kind].get(job)
            return 0 if histogram is None else sum(histogram.buckets_by_bound_ms.values())

        def counter(kind: Field, job: str) -> int:
            return self.counters[kind].get((job,), 0)

        return {
            # Never below 0: a hash written by an older version (or edited) must not show a negative gauge.
            job: max(0, count(Field.WAIT_BUCKET, job) - count(Field.DURATION_BUCKET, job)
                     - counter(Field.RETRIES, job) - counter(Field.IN_PROGRESS_ADJUST, job))
            for job in self.histograms[Field.WAIT_BUCKET]
        }

    def _add(self, kind: Field, rest: str, value: int) -> None:
        if kind in (Field.DURATION_BUCKET, Field.WAIT_BUCKET):
            job, _, bound = rest.rpartition("|")
            histogram = self.histograms[kind].setdefault(job, _Histogram())
            key = None if bound == INF_BOUND else _fold(int(bound))
            histogram.buckets_by_bound_ms[key] = histogram.buckets_by_bound_ms.get(key, 0) + value
        elif kind in (Field.DURATION_SUM, Field.WAIT_SUM):
            bucket_kind = Field.DURATION_BUCKET if kind is Field.DURATION_SUM else Field.WAIT_BUCKET
            self.histograms[bucket_kind].setdefault(rest, _Histogram()).sum_ms += value
        else:
            # Job and guard names may hold "|" only in their first part: the last label never does.
            labels: _Labels = tuple(rest.rsplit("|", 1)) if kind in _TWO_LABELS else (rest,)
            self.counters[kind][labels] = value


_TWO_LABELS = frozenset({Field.FINISHED, Field.RECOVERED, Field.GUARD_REQUESTS})


def _fold(bound_ms: int) -> int | None:
    """A bound the bounds no longer have (they changed since it was counted) joins the next one up."""
    return next((b for b in bucket_bounds_ms() if b >= bound_ms), None)


def _histogram(name: str, doc: str, by_job: Mapping[str, _Histogram]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(PREFIX + name, doc, labels=["job"])
    for job, histogram in sorted(by_job.items()):
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound_ms, bound_s in zip(bucket_bounds_ms(), BUCKETS_S, strict=True):
            running += histogram.buckets_by_bound_ms.get(bound_ms, 0)
            buckets.append((floatToGoString(bound_s), running))  # type: ignore[no-untyped-call]
        buckets.append(("+Inf", running + histogram.buckets_by_bound_ms.get(None, 0)))
        family.add_metric([job], buckets, sum_value=histogram.sum_ms / 1000)
    return family


_COUNTERS: tuple[tuple[Field, str, str, tuple[str, ...]], ...] = (
    (Field.ENQUEUED, "jobs_enqueued", "Jobs created and queued (groups' children and finalizers included).", ("job",)),
    (Field.FINISHED, "jobs_finished", "Jobs that reached a terminal status.", ("job", "status")),
    (Field.RETRIES, "job_retries", "Attempts that ended in RETRY (the job runs again later).", ("job",)),
    (Field.GATE_REJECTIONS, "gate_rejections", "Enqueues refused: max_concurrent jobs already in flight.", ("job",)),
    (Field.RECOVERED, "recovered_jobs", "Jobs settled after their worker was lost, by what was done.",
     ("job", "action")),
    (Field.GROUPS_FINALIZED, "groups_finalized", "Groups whose finalizer was queued, by how they ended.", ("status",)),
    (Field.GUARD_REQUESTS, "guard_requests", "Requests on a guarded connection, by outcome or refusal.",
     ("guard", "result")),
)


def families(
    snapshot: MetricsSnapshot, *, workers_alive: int, queue: QueueStats, guards: Mapping[str, CircuitState]
) -> Iterator[Metric]:
    """Every family, in a fixed order (the table of docs/metrics.md)."""
    for kind, name, doc, labels in _COUNTERS:
        counter = CounterMetricFamily(PREFIX + name, doc, labels=list(labels))
        for values, value in sorted(snapshot.counters[kind].items()):
            # The status label in lower case, as Prometheus labels usually are.
            counter.add_metric([v.lower() if kind is Field.FINISHED and i == 1 else v for i, v in enumerate(values)],
                               value)
        yield counter
    yield _histogram("job_duration_seconds", "Run time of the attempt that ended each job (jobs that ran).",
                     snapshot.histograms[Field.DURATION_BUCKET])
    yield _histogram("job_queue_wait_seconds", "From queued (enqueue, retry or hand-back) to the start of a run.",
                     snapshot.histograms[Field.WAIT_BUCKET])
    in_progress = GaugeMetricFamily(PREFIX + "jobs_in_progress", "Jobs running now.", labels=["job"])
    for job, value in sorted(snapshot.in_progress().items()):
        in_progress.add_metric([job], value)
    yield in_progress
    yield GaugeMetricFamily(PREFIX + "queue_depth", "Engine jobs queued (due or deferred).", value=queue.depth)
    yield GaugeMetricFamily(PREFIX + "queue_oldest_age_seconds", "How long the oldest due job has waited.",
                            value=queue.oldest_due_age_s)
    yield GaugeMetricFamily(PREFIX + "workers_alive", "Worker processes whose heartbeat has not expired.",
                            value=workers_alive)
    guard_state = GaugeMetricFamily(PREFIX + "guard_state", "Circuit of a guarded connection: 0 closed, "
                                    "1 half-open, 2 open.", labels=["guard"])
    for guard, state in sorted(guards.items()):
        guard_state.add_metric([guard], GUARD_STATE_VALUES[state])
    yield guard_state


def guard_names(snapshot: MetricsSnapshot) -> list[str]:
    """The guarded connections that have counted a request (a bounded set: the app's connection names)."""
    return sorted({labels[0] for labels in snapshot.counters[Field.GUARD_REQUESTS]})


async def guard_states(guard: ConnectionGuard, names: Iterable[str]) -> dict[str, CircuitState]:
    """The circuit of each connection: those `names` (the ones that counted a request) and every
    connection with a recorded state (`ConnectionGuard.states()`, one script call); a counted name
    without a state is closed (its state expired idle)."""
    found = {name: CircuitState.CLOSED for name in names}
    found.update({state.name: state.state for state in await guard.states()})
    return found


class _OneShot(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


async def render(client: ClientAgent, *, guard: ConnectionGuard | None = None) -> bytes:
    """Read the metrics hash and the live workers (one pipeline), the queue, the guards' circuits
    (when `guard` is given), and answer the Prometheus text exposition (`CONTENT_TYPE`)."""
    jobs = client.agent.job_store
    keys = jobs.keys
    with _reachable("read the metrics"):
        async with jobs.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.metrics)
            # The rule of WorkerDirectory.alive (heartbeat expiry in the future), counted in Redis.
            pipe.zcount(keys.workers, now_ms(), "+inf")
            raw, alive = await pipe.execute()
        queue = await client.queue_stats()
        snapshot = MetricsSnapshot.parse(raw)
        guards = await guard_states(guard, guard_names(snapshot)) if guard is not None else {}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_OneShot(list(families(snapshot, workers_alive=int(alive), queue=queue, guards=guards))))
    return generate_latest(registry)
