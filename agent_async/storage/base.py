"""ClientStorage: the abstract large-blob store, and BlobStream, its streaming read handle."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, Self

from agent_async.settings import AgentSettings
from agent_async.storage.reference import is_reference
from agent_async.storage.source import StorageSource
from agent_async.storage.text import DEFAULT_CHARSET, decode_text, encode_text, with_charset

__all__ = ["BlobStream", "ClientStorage"]


class BlobStream(ABC):
    """An open stored blob, read chunk by chunk so it is never held whole in memory."""

    content_type: str
    size_bytes: int

    @abstractmethod
    def iter_chunks(self) -> AsyncIterator[bytes]:
        """Yield the blob's bytes in order; each chunk is verified before it is yielded.

        Raises StorageIntegrityError on a corrupt chunk (before yielding it) and, after the last
        chunk, if the total size or whole-blob hash does not match.
        """


class ClientStorage(ABC):
    """The storage contract; one instance is scoped to one `StorageSource`.

    References are opaque strings `agent:file:<32 hex>`. Unknown, malformed or foreign references
    load as None and delete as a no-op. Every method except `is_reference` is a coroutine.
    """

    @classmethod
    @abstractmethod
    def from_settings(
        cls, settings: AgentSettings, source: StorageSource | str, *, connection: Any = None
    ) -> Self:
        """Build the backend from settings; must open nothing (see `create_storage`)."""

    @staticmethod
    def is_reference(value: object) -> bool:
        """True if `value` looks like a blob reference; any object is accepted."""
        return is_reference(value)

    @abstractmethod
    async def save(self, data: bytes, content_type: str) -> str:
        """Store `data` atomically and return its reference."""

    @abstractmethod
    async def load(self, ref: object) -> tuple[bytes, str] | None:
        """The blob's bytes and content type, or None if `ref` is not one of this source's blobs."""

    @abstractmethod
    async def open(self, ref: object) -> BlobStream | None:
        """A streaming handle on the blob, or None if `ref` is not one of this source's blobs."""

    @abstractmethod
    async def delete(self, ref: object) -> None:
        """Delete the blob if it is one of this source's; anything else is a no-op."""

    @abstractmethod
    async def purge_older_than(self, max_age_s: float) -> int:
        """Delete this source's blobs saved more than `max_age_s` ago; return how many."""

    @abstractmethod
    async def list_references(self, *, limit: int = 1000) -> list[str]:
        """This source's references, oldest first (for orphan sweeps)."""

    async def save_text(
        self, text: str, content_type: str = "text/plain", *, charset: str = DEFAULT_CHARSET
    ) -> str:
        """Store decoded text; the charset is recorded in the content type's `charset=` parameter.

        Lone surrogates U+DC80..U+DCFF (from a lenient `errors="surrogateescape"` decode) are
        written back as the original bytes, so non-UTF-8 input round-trips exactly.
        """
        return await self.save(encode_text(text, charset), with_charset(content_type, charset))

    async def load_text(self, ref: object) -> str | None:
        """The blob decoded with the charset of its content type (UTF-8 if none), or None."""
        found = await self.load(ref)
        if found is None:
            return None
        data, content_type = found
        return decode_text(data, content_type)

    async def close(self) -> None:  # noqa: B027 - optional hook, a no-op for stateless backends
        """Release what the store opened itself (never a connection it was given)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
