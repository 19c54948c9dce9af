"""The metrics hash: its field names, the histogram bounds, and the values the Lua scripts count.

The store's scripts (store/lua/lib.lua and the scripts that call its `metric`/`observe`) increment
fields of one hash per namespace (`KeySpace.metrics`) inside the transitions themselves; the
collector (agent_async.metrics.collector) reads the hash back. Both sides spell the fields from
here: the prefixes below, then `|`-separated label values (a job name, then a status or an action).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "BUCKETS_S",
    "Field",
    "GroupOutcome",
    "GuardResult",
    "RecoveryAction",
    "lua_constants",
]

# Bounds of both histograms (run duration, queue wait), seconds, ascending. Whole milliseconds:
# the scripts compare and sum in ms (HINCRBY is integer; HINCRBYFLOAT would cost more and drift).
BUCKETS_S: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)
INF_BOUND = "inf"  # the field suffix of the +Inf bucket


def bucket_bounds_ms() -> tuple[int, ...]:
    bounds = tuple(round(b * 1000) for b in BUCKETS_S)
    if any(abs(ms - b * 1000) > 1e-6 for ms, b in zip(bounds, BUCKETS_S, strict=True)):
        raise ValueError("histogram bounds must be whole milliseconds")
    if list(bounds) != sorted(set(bounds)):
        raise ValueError("histogram bounds must be strictly ascending")
    return bounds


class Field(StrEnum):
    """Prefixes of the hash's fields (`<prefix>|<label>|...`)."""

    ENQUEUED = "enq"  # |job
    FINISHED = "fin"  # |job|status (JobStatus value)
    RETRIES = "retry"  # |job
    # |job: runs that left STARTED other than by their end (counted by the duration histogram) or a
    # retry: +1 for a hand-back, an undone start, an orphan re-queued; -1 for a way into STARTED
    # other than a start from the queue (counted by the wait histogram). jobs_in_progress is
    # waits - durations - retries - this: no write on the hot path.
    IN_PROGRESS_ADJUST = "run_adj"
    DURATION_BUCKET = "dur_b"  # |job|bound ms (or "inf"): non-cumulative count
    DURATION_SUM = "dur_sum"  # |job: ms
    WAIT_BUCKET = "wait_b"  # |job|bound ms
    WAIT_SUM = "wait_sum"  # |job: ms
    GATE_REJECTIONS = "gate"  # |job
    RECOVERED = "rec"  # |job|action (RecoveryAction)
    GROUPS_FINALIZED = "grp"  # |status (GroupOutcome)
    GUARD_REQUESTS = "greq"  # |guard|result (GuardResult)


class RecoveryAction(StrEnum):
    """What was done with a job whose worker was lost (orphan.lua, or start.lua on a redelivery)."""

    REQUEUED = "requeued"  # queued again by the recovery pass
    RESUMED = "resumed"  # redelivered by the engine and run again
    FAILED = "failed"  # may not resume, or out of attempts
    CANCELED = "canceled"  # a cancel was pending


class GroupOutcome(StrEnum):
    """How a group ended, counted once when its finalizer is queued (lib.lua's try_finalize)."""

    SUCCEEDED = "succeeded"  # every child succeeded
    FAILED = "failed"  # at least one child failed
    CANCELED = "canceled"  # the group was canceled, or a child was


class GuardResult(StrEnum):
    """One request on a guarded connection: its recorded outcome, or why it was refused."""

    OK = "ok"
    FAIL = "fail"
    DROP = "drop"  # no verdict: cancelled, or given up before it started
    REFUSED_OPEN = "refused_open"  # circuit open
    REFUSED_TRIAL = "refused_trial"  # half-open, another caller's trial in flight


def lua_constants(metrics_key: str) -> dict[str, str]:
    """Placeholders of store/lua/lib.lua: the hash ('' = metrics off), the bounds in ms, and the same
    bounds as the text of their field names (a number turned into text costs Redis a printf)."""
    bounds = bucket_bounds_ms()
    return {
        "@METRICS@": metrics_key, "@BUCKETS_MS@": ",".join(str(b) for b in bounds),
        "@BUCKET_NAMES@": ",".join(f"'{b}'" for b in bounds),
    }
