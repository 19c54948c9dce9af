"""KeySpace: the one place that names every Redis key this layer writes."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GLOBAL_SCOPE", "KeySpace"]

# Scope of a concurrency slot taken by a job enqueued without a user (a system job).
GLOBAL_SCOPE = "_global"


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Key layout under one namespace; two namespaces on one Redis never share a key of ours.

    arq's own per-job keys (`arq:job:<id>`, `arq:in-progress:<id>`, ...) are global; Agent makes
    them distinct by prefixing the engine job id with the namespace (see `engine_job_id`).
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

    def cron_function(self, schedule_name: str, index: int) -> str:
        """Name of the arq cron function `index` of a schedule (its ticks' arq job ids start so)."""
        return f"{self.namespace}:cron:{schedule_name}:{index}"

    @property
    def override_ticker(self) -> str:
        return f"{self.namespace}:cron:_overrides"

    def is_cron_tick(self, engine_job_id: str) -> bool:
        return engine_job_id.startswith(f"{self.namespace}:cron:")

    @property
    def active_index(self) -> str:
        """Non-terminal jobs, scored by the time of their last transition (ms)."""
        return f"{self.namespace}:idx:active"

    def gate(self, job_name: str, scope: str | None) -> str:
        return f"{self.namespace}:gate:{job_name}:{scope or GLOBAL_SCOPE}"

    @property
    def leases(self) -> str:
        """Running jobs, scored by the time (ms) their worker's lease runs out."""
        return f"{self.namespace}:leases"

    @property
    def cancel_channel(self) -> str:
        return f"{self.namespace}:cancel"

    @property
    def queue(self) -> str:
        return f"{self.namespace}:queue"

    @property
    def recovery_lock(self) -> str:
        return f"{self.namespace}:lock:recovery"

    def engine_job_id(self, job_id: str) -> str:
        return f"{self.namespace}:{job_id}"

    def job_id_from_engine(self, engine_job_id: str) -> str | None:
        prefix = f"{self.namespace}:"
        return engine_job_id[len(prefix):] if engine_job_id.startswith(prefix) else None
