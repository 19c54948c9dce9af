"""The large-blob store: ClientStorage and its backends, chosen by AGENT_STORAGE_TYPE."""

from __future__ import annotations

from agent_async.storage.base import BlobStream, ClientStorage
from agent_async.storage.database import ClientStorageDatabase
from agent_async.storage.factory import create_storage
from agent_async.storage.migrate import upgrade, upgrade_async
from agent_async.storage.reference import REFERENCE_PREFIX
from agent_async.storage.source import StorageSource

__all__ = [
    "REFERENCE_PREFIX",
    "BlobStream",
    "ClientStorage",
    "ClientStorageDatabase",
    "StorageSource",
    "create_storage",
    "upgrade",
    "upgrade_async",
]
