"""ASGI entry point: `hypercorn app.asgi:app` (settings from the AGENT_* environment)."""

from __future__ import annotations

from app.factory import create_app

app = create_app()
