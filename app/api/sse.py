"""Server-Sent Events: job events (ClientAgent.events) streamed as `text/event-stream`.

Each event is one frame, `id: <stream id>`, `event: <type>` ("status" or "progress"), `data: <JSON of
JobEvent.to_dict()>`; a reconnecting client sends the last id it saw back as `Last-Event-ID` and gets
what it missed. While no event comes for HEARTBEAT_SECONDS (app config `AGENT_SSE_HEARTBEAT_SECONDS`
overrides it) a comment line keeps proxies and clients from timing the connection out.

The body is an async generator: when the client goes away, Quart closes it (its `finally` runs) and
the reader it holds (a blocking XREAD on one Redis connection) is closed with it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from quart import Response, current_app

from agent_async import ClientAgent, JobEvent, JobStatus
from agent_async.store.events import EVENT_ID_PATTERN
from app.api.schemas import JobEventOut, optional_parameters

__all__ = [
    "HEARTBEAT",
    "HEARTBEAT_CONFIG_KEY",
    "HEARTBEAT_SECONDS",
    "SSE_CONTENT",
    "SSE_HEADERS",
    "SseHeaders",
    "admin_stream",
    "event_frame",
    "heartbeat_seconds",
    "job_stream",
    "open_streams",
    "sse_response",
]

# Idle time before a heartbeat comment; the app config key overrides it (tests shorten it).
HEARTBEAT_SECONDS = 15.0
HEARTBEAT_CONFIG_KEY = "AGENT_SSE_HEARTBEAT_SECONDS"
HEARTBEAT = b": keep-alive\n\n"
# How long the reader of an already finished job waits for more before deciding it has caught up:
# all of that job's events are in the stream already.
_FINISHED_IDLE_SECONDS = 0.05

# What the OpenAPI document says of both streams. Before OpenAPI 3.2 (`itemSchema`), the `schema` of a
# text/event-stream describes one event: its fields, `data` a JSON text whose schema is JobEventOut.
SSE_CONTENT = {
    "text/event-stream": {
        "schema": {
            "description": "One event. `: keep-alive` comments are sent while idle (a comment is no event).",
            "type": "object",
            "required": ["id", "event", "data"],
            "properties": {
                "id": {"type": "string", "pattern": EVENT_ID_PATTERN,
                       "description": "The event id: send the last one back as `Last-Event-ID` to resume."},
                "event": {"type": "string", "enum": ["status", "progress"]},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": JobEventOut.model_json_schema(),
                    "description": "The event as JSON: a JobEventOut.",
                },
            },
        },
    },
}
SSE_HEADERS = {
    "Cache-Control": {"description": "`no-cache`.", "required": True, "schema": {"type": "string"}},
    "X-Accel-Buffering": {
        "description": "`no`: a proxy (nginx) must pass every event on at once.",
        "required": True,
        "schema": {"type": "string"},
    },
}

_open_streams = 0


def open_streams() -> int:
    """How many event streams this process is serving now (a closed connection no longer counts)."""
    return _open_streams


class SseHeaders(BaseModel):
    """The request header a reconnecting EventSource sends: the id of the last event it received."""

    model_config = ConfigDict(json_schema_extra=optional_parameters)

    last_event_id: str | None = Field(default=None, pattern=EVENT_ID_PATTERN)


def heartbeat_seconds() -> float:
    return float(current_app.config.get(HEARTBEAT_CONFIG_KEY, HEARTBEAT_SECONDS))


def event_frame(event: JobEvent) -> bytes:
    # JSON on one line (json.dumps escapes line breaks), so `data:` is a single field.
    data = json.dumps(event.to_dict(), separators=(",", ":"))
    return f"id: {event.event_id}\nevent: {event.type.value}\ndata: {data}\n\n".encode()


def sse_response(body: AsyncIterator[bytes]) -> Response:
    response = Response(body, status=200, content_type="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    response.timeout = None  # a stream lasts as long as the job (or the admin's interest)
    return response


async def _frames(
    events: AsyncIterator[JobEvent | None], first: Any, on_idle: Callable[[], Awaitable[bool]] | None
) -> AsyncIterator[bytes]:
    global _open_streams
    _open_streams += 1
    try:
        pending: list[JobEvent | None] = [] if first is _NOTHING else [first]
        while True:
            if pending:
                event = pending.pop()
            else:
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    return
            if event is None:
                if on_idle is not None and await on_idle():
                    return
                yield HEARTBEAT
            else:
                yield event_frame(event)
    finally:
        _open_streams -= 1
        await _close(events)


_NOTHING = object()


async def _close(events: AsyncIterator[JobEvent | None]) -> None:
    aclose = getattr(events, "aclose", None)  # ClientAgent.events is an async generator
    if aclose is not None:
        await aclose()


async def job_stream(client: ClientAgent, job_id: str, *, finished: bool, last_event_id: str | None,
                     heartbeat_s: float) -> AsyncIterator[bytes] | None:
    """One job's events (from its creation, or after `last_event_id`), ending after its terminal event.

    None when the job had finished already and nothing is left to send (a client that saw the end and
    reconnects): the caller answers 204, which tells an EventSource to stop reconnecting.
    """
    events = client.events(
        job_id=job_id, last_event_id=last_event_id, idle_s=_FINISHED_IDLE_SECONDS if finished else heartbeat_s
    )

    async def ended() -> bool:
        # Idle: the job's terminal event may be behind the reader (a Last-Event-ID past it) or trimmed
        # from the capped stream; the job's state says whether to wait on.
        state = await client.get_state(job_id)
        return state is None or state.is_terminal

    if not finished:
        return _frames(events, _NOTHING, ended)
    first = await anext(events, None)
    if first is None:
        await _close(events)
        return None
    return _frames(events, first, _caught_up)


async def _caught_up() -> bool:
    # An already finished job: an idle reader has read everything of it there is.
    return True


async def admin_stream(client: ClientAgent, *, name: str | None, user_uid: str | None, status: JobStatus | None,
                       last_event_id: str | None, heartbeat_s: float) -> AsyncIterator[bytes]:
    """Every job's events from now on (or after `last_event_id`), filtered; never ends by itself.

    "Now" is read before the answer starts: an event that happens once the client has the headers is sent.
    """
    after = last_event_id if last_event_id is not None else await client.agent.events.last_id()
    events = client.events(name=name, user_uid=user_uid, status=status, last_event_id=after, idle_s=heartbeat_s)
    return _frames(events, _NOTHING, None)
