"""KeySpace: the one place that names every Redis key of the job store (the engine names its own)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GLOBAL_SCOPE", "KeySpace"]

# Scope of a concurrency slot taken by a job enqueued without a user (a system job).
GLOBAL_SCOPE = "_global"


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Key layout under one namespace; two namespaces on one Redis never share a key of ours.

    The queue engine's keys (its queue, its per-job keys) are named by the engine package, under
    the same namespace.
    """

    namespace: str

    def state(self, job_id: str) -> str:
        return f"{self.namespace}:state:{job_id}"

    def user_index(self, user_uid: str) -> str:
        return f"{self.namespace}:idx:user:{user_uid}"

    def schedule_index(self, schedule_name: str) -> str:
        return f"{self.namespace}:idx:schedule:{schedule_name}"

    def schedule_skips(self, schedule_name: str) -> str:
        """Recent ticks of a schedule that created no run, and why (newest first)."""
        return f"{self.namespace}:schedule:skips:{schedule_name}"

    @property
    def all_index(self) -> str:
        """Every job, scored by its creation time (ms): listings across users (pruned as states expire)."""
        return f"{self.namespace}:idx:all"

    def name_index(self, job_name: str) -> str:
        """Jobs of one job type, scored by creation time (ms); lib.lua derives it from active_index."""
        return f"{self.namespace}:idx:name:{job_name}"

    def status_index(self, status: str) -> str:
        """Ended jobs of one terminal status, scored by the end time (ms); written by lib.lua's end_job."""
        return f"{self.namespace}:idx:status:{status}"

    def ended_counts(self, hour: int | str) -> str:
        """Jobs ended within one hour (epoch ms // 3,600,000): `<job name>|<status>` -> count (a hash
        expiring with the retention). `hour=""` gives the prefix the overview script appends hours to."""
        return f"{self.namespace}:idx:counts:{hour}"

    @property
    def active_index(self) -> str:
        """Non-terminal jobs, scored by the time of their last transition (ms)."""
        return f"{self.namespace}:idx:active"

    def gate(self, job_name: str, user_uid: str | None) -> str:
        """A user's slots are apart from the system's: no user id, not even "_global", shares them."""
        scope = GLOBAL_SCOPE if user_uid is None else f"user:{user_uid}"
        return f"{self.namespace}:gate:{job_name}:{scope}"

    @property
    def leases(self) -> str:
        """Running jobs, scored by the time (ms) their worker's lease runs out."""
        return f"{self.namespace}:leases"

    @property
    def cancel_channel(self) -> str:
        return f"{self.namespace}:cancel"

    def group(self, group_id: str) -> str:
        """A fan-out group's hash; its sets and lists are this key + ':ended', ':live', ':waiting', ':failed'."""
        return f"{self.namespace}:group:{group_id}"

    @property
    def groups_final_pending(self) -> str:
        """Groups whose finalizer could not be queued when their last child ended (recovery retries)."""
        return f"{self.namespace}:groups:final_pending"

    @property
    def owned_blobs(self) -> str:
        """Jobs that own large-store blobs: job id -> JSON list of references, until deleted."""
        return f"{self.namespace}:owned_blobs"

    @property
    def workers(self) -> str:
        """Live worker processes: worker id -> the expiry (ms) of its last heartbeat."""
        return f"{self.namespace}:workers"

    def worker(self, worker_id: str) -> str:
        """One worker's description (JSON), expiring with its heartbeat."""
        return f"{self.namespace}:worker:{worker_id}"

    @property
    def events(self) -> str:
        """Every transition and progress update, in order (a capped stream: XADD MAXLEN ~)."""
        return f"{self.namespace}:events"

    @property
    def metrics(self) -> str:
        """Counters and histogram buckets (agent_async.metrics.layout), written by the store's and
        the guard's scripts."""
        return f"{self.namespace}:metrics"

    @property
    def recovery_lock(self) -> str:
        return f"{self.namespace}:lock:recovery"

    @property
    def guard_names(self) -> str:
        """Every guarded connection used lately, scored by its last use (epoch ms): what an admin lists."""
        return f"{self.namespace}:guards"

    def guard(self, name: str) -> str:
        """Prefix of a guarded connection's keys (agent_async.guard names the sub-keys below it)."""
        return f"{self.namespace}:guard:{name}"
