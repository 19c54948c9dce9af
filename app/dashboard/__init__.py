"""The operator dashboard under /admin/ui: server-rendered pages, cookie sessions, live updates (SSE)."""

from __future__ import annotations

from app.dashboard.views import blueprint

__all__ = ["blueprint"]
