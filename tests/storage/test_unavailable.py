"""A store whose database cannot be reached fails with StorageUnavailableError, without leaking secrets."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from agent_async.errors import StorageError, StorageUnavailableError
from agent_async.storage import ClientStorageDatabase
from agent_async.storage.reference import reference_of

PASSWORD = "s3cr3t-Pa55"
# Port 1 on loopback is closed on any sane machine: the connect is refused at once.
DOWN_URLS = {
    "PostgreSQL": f"postgresql+asyncpg://agent:{PASSWORD}@127.0.0.1:1/blobs",
    "MariaDB": f"mysql+aiomysql://agent:{PASSWORD}@127.0.0.1:1/blobs",
}
OPERATIONS: dict[str, Callable[[ClientStorageDatabase], Awaitable[object]]] = {
    "save": lambda store: store.save(b"x", "text/plain"),
    "load": lambda store: store.load(reference_of("0" * 32)),
    "open": lambda store: store.open(reference_of("0" * 32)),
    "delete": lambda store: store.delete(reference_of("0" * 32)),
    "purge": lambda store: store.purge_older_than(60),
    "list": lambda store: store.list_references(),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
@pytest.mark.parametrize("backend", sorted(DOWN_URLS))
async def test_unreachable_database_raises_unavailable_without_password(backend: str, operation: str) -> None:
    """Every operation raises StorageUnavailableError (a ConnectionError) naming the backend, no password."""
    store = ClientStorageDatabase("agent", database_url=DOWN_URLS[backend])
    with pytest.raises(StorageUnavailableError) as caught:
        await OPERATIONS[operation](store)
    assert isinstance(caught.value, ConnectionError)
    message = str(caught.value)
    assert backend in message
    assert "127.0.0.1:1" in message
    assert PASSWORD not in message
    assert PASSWORD not in repr(store)
    await store.close()


async def test_unmigrated_database_names_the_migration_command(tmp_path: object) -> None:
    """Missing tables raise a StorageError (not 'unavailable') telling the user how to migrate."""
    store = ClientStorageDatabase("agent", database_url=f"sqlite+aiosqlite:///{tmp_path}/empty.db")
    with pytest.raises(StorageError, match=r"agent_async\.storage\.migrate") as caught:
        await store.save(b"x", "text/plain")
    assert not isinstance(caught.value, StorageUnavailableError)
    await store.close()
