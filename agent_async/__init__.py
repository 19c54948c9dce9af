"""agent-async: asyncio-native job infrastructure on arq + Redis."""

from agent_async.agent import Agent
from agent_async.client import ClientAgent, EnqueuedOnce, EnqueueResult
from agent_async.engine import QueueStats
from agent_async.errors import (
    ERROR_JOB_CONCURRENT_LIMIT,
    ERROR_JOB_PAYLOAD_INVALID,
    ERROR_JOB_UNKNOWN,
    AccessRevoked,
    AgentError,
    BatchEnqueueError,
    ConfigurationError,
    ConnectionCoolingDown,
    DuplicateJobError,
    EnqueueError,
    GroupError,
    JobDeclarationError,
    QueueUnavailableError,
    RequestCode,
    RequestException,
    RequestRefusedError,
    SoftTimeLimitExceeded,
    StorageError,
    StorageIntegrityError,
    StorageUnavailableError,
)
from agent_async.groups import GroupFinalizer, GroupView
from agent_async.guard import CircuitState, ConnectionGuard, GuardConfig, GuardRetryable, GuardState
from agent_async.job import Job, JobResources, agent_job, init_jobs
from agent_async.lifecycle import ACTIVE, TERMINAL, ErrorKind, JobStatus
from agent_async.logs import LogFormat, configure_logging
from agent_async.registry import JobRegistry, registry
from agent_async.request import JobRequest
from agent_async.runs import RunRecord, RunRecords, RunStatus, RunTrigger
from agent_async.settings import AgentSettings
from agent_async.state import JobState, keyed_job_id
from agent_async.store.events import EventType, JobEvent
from agent_async.store.workers import WorkerInfo
from agent_async.worker.child import ChildProcessLost, run_in_child
from agent_async.worker.progress import report_progress

__all__ = [
    "ACTIVE",
    "ERROR_JOB_CONCURRENT_LIMIT",
    "ERROR_JOB_PAYLOAD_INVALID",
    "ERROR_JOB_UNKNOWN",
    "TERMINAL",
    "AccessRevoked",
    "Agent",
    "AgentError",
    "AgentSettings",
    "BatchEnqueueError",
    "ChildProcessLost",
    "CircuitState",
    "ClientAgent",
    "ConfigurationError",
    "ConnectionCoolingDown",
    "ConnectionGuard",
    "DuplicateJobError",
    "EnqueueError",
    "EnqueueResult",
    "EnqueuedOnce",
    "ErrorKind",
    "EventType",
    "GroupError",
    "GroupFinalizer",
    "GroupView",
    "GuardConfig",
    "GuardRetryable",
    "GuardState",
    "Job",
    "JobDeclarationError",
    "JobEvent",
    "JobRegistry",
    "JobRequest",
    "JobResources",
    "JobState",
    "JobStatus",
    "LogFormat",
    "QueueStats",
    "QueueUnavailableError",
    "RequestCode",
    "RequestException",
    "RequestRefusedError",
    "RunRecord",
    "RunRecords",
    "RunStatus",
    "RunTrigger",
    "SoftTimeLimitExceeded",
    "StorageError",
    "StorageIntegrityError",
    "StorageUnavailableError",
    "WorkerInfo",
    "agent_job",
    "configure_logging",
    "init_jobs",
    "keyed_job_id",
    "registry",
    "report_progress",
    "run_in_child",
]
