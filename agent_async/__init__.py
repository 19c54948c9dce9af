"""agent-async: asyncio-native job infrastructure on arq + Redis."""

from agent_async.agent import Agent
from agent_async.child import ChildProcessLost, run_in_child
from agent_async.client import ClientAgent
from agent_async.errors import (
    ERROR_JOB_CONCURRENT_LIMIT,
    ERROR_JOB_NOT_FOUND,
    ERROR_JOB_PAYLOAD_INVALID,
    ERROR_JOB_UNKNOWN,
    AgentError,
    ConfigurationError,
    EnqueueError,
    JobDeclarationError,
    QueueUnavailableError,
    RequestException,
    SoftTimeLimitExceeded,
    StorageError,
    StorageIntegrityError,
    StorageUnavailableError,
)
from agent_async.job import Job, agent_job, init_jobs
from agent_async.registry import JobRegistry, registry
from agent_async.request import JobRequest
from agent_async.settings import AgentSettings
from agent_async.state import ACTIVE, TERMINAL, JobState, JobStatus

__all__ = [
    "ACTIVE",
    "ERROR_JOB_CONCURRENT_LIMIT",
    "ERROR_JOB_NOT_FOUND",
    "ERROR_JOB_PAYLOAD_INVALID",
    "ERROR_JOB_UNKNOWN",
    "TERMINAL",
    "Agent",
    "AgentError",
    "AgentSettings",
    "ChildProcessLost",
    "ClientAgent",
    "ConfigurationError",
    "EnqueueError",
    "Job",
    "JobDeclarationError",
    "JobRegistry",
    "JobRequest",
    "JobState",
    "JobStatus",
    "QueueUnavailableError",
    "RequestException",
    "SoftTimeLimitExceeded",
    "StorageError",
    "StorageIntegrityError",
    "StorageUnavailableError",
    "agent_job",
    "init_jobs",
    "registry",
    "run_in_child",
]
