"""The reference Quart application of agent-async: a calendar API whose ICS export and import run as jobs."""

from __future__ import annotations

from app.factory import create_app

__all__ = ["create_app"]
