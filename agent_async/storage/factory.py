"""create_storage: the backend named by AGENT_STORAGE_TYPE, found by module and class name."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from agent_async.errors import ConfigurationError
from agent_async.settings import AgentSettings
from agent_async.storage.base import ClientStorage
from agent_async.storage.source import StorageSource

__all__ = ["backend_class", "create_storage"]

_PACKAGE = "agent_async.storage"


def backend_class(storage_type: str) -> type[ClientStorage]:
    """`agent_async.storage.<type>.ClientStorage<Type>`: a new backend is one module, no registry edit."""
    class_name = "ClientStorage" + "".join(part.capitalize() for part in storage_type.split("_"))
    try:
        module = importlib.import_module(f"{_PACKAGE}.{storage_type}")
    except ModuleNotFoundError as error:
        if error.name != f"{_PACKAGE}.{storage_type}":
            raise  # the backend exists but one of its own imports is missing: show that, not "unknown"
        raise ConfigurationError(
            f"invalid setting AGENT_STORAGE_TYPE={storage_type!r}: no module {_PACKAGE}.{storage_type}"
        ) from None
    found = getattr(module, class_name, None)
    if not (inspect.isclass(found) and issubclass(found, ClientStorage) and not inspect.isabstract(found)):
        raise ConfigurationError(
            f"invalid setting AGENT_STORAGE_TYPE={storage_type!r}: "
            f"{module.__name__} defines no concrete ClientStorage subclass {class_name}"
        )
    return found


def create_storage(
    settings: AgentSettings, source: StorageSource | str, *, connection: Any = None
) -> ClientStorage:
    """The configured store scoped to `source`; opens nothing until first used."""
    return backend_class(settings.storage_type).from_settings(settings, source, connection=connection)
