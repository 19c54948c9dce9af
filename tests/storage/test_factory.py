"""create_storage picks the backend named by AGENT_STORAGE_TYPE and opens nothing."""

from __future__ import annotations

import pytest

from agent_async.errors import ConfigurationError
from agent_async.settings import AgentSettings
from agent_async.storage import ClientStorageDatabase, StorageSource, create_storage


def test_database_type_builds_a_database_store_from_settings() -> None:
    """storage_type='database' gives ClientStorageDatabase with the configured URL and chunk size."""
    settings = AgentSettings(database_url="postgresql+asyncpg://u:pw@db.invalid/x", storage_chunk_bytes=4096)
    store = create_storage(settings, StorageSource.AGENT)
    assert isinstance(store, ClientStorageDatabase)
    assert store.source == "agent"
    assert store._chunk_bytes == 4096
    assert store._engine is None  # constructing opened nothing, not even an engine
    assert "pw" not in repr(store)


@pytest.mark.parametrize("storage_type", ["webdav", "base", "reference"])
def test_unknown_storage_type_is_a_configuration_error_naming_the_setting(storage_type: str) -> None:
    """A type with no `agent_async.storage.<type>.ClientStorage<Type>` raises ConfigurationError."""
    with pytest.raises(ConfigurationError, match="AGENT_STORAGE_TYPE"):
        create_storage(AgentSettings(storage_type=storage_type), StorageSource.AGENT)


@pytest.mark.parametrize("source", ["", "Upper", "has space", "x" * 65, "a'b"])
def test_invalid_source_is_refused(source: str) -> None:
    """A source tag must be 1-64 lower-case letters, digits, '_', '.' or '-'."""
    with pytest.raises(ValueError, match="storage source"):
        create_storage(AgentSettings(), source)


def test_connection_must_be_an_async_connection() -> None:
    """Passing something other than an AsyncConnection fails at construction, not deep in a query."""
    with pytest.raises(TypeError, match="AsyncConnection"):
        create_storage(AgentSettings(), StorageSource.AGENT, connection=object())
