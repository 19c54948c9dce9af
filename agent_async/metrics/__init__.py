"""Prometheus metrics of a namespace, counted by the store's Lua scripts in Redis and rendered at scrape.

`render(client)` answers the Prometheus text exposition; it needs the `metrics` extra
(prometheus-client), imported only when it is called: the counting itself needs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_async.metrics.layout import BUCKETS_S, GroupOutcome, GuardResult, RecoveryAction

if TYPE_CHECKING:
    from agent_async.client import ClientAgent
    from agent_async.guard import ConnectionGuard

__all__ = ["BUCKETS_S", "GroupOutcome", "GuardResult", "RecoveryAction", "render"]


async def render(client: ClientAgent, *, guard: ConnectionGuard | None = None) -> bytes:
    """The namespace's metrics as Prometheus text (see agent_async.metrics.collector.render; its
    `CONTENT_TYPE` is the media type to serve it with)."""
    from agent_async.metrics.collector import render as _render

    return await _render(client, guard=guard)
