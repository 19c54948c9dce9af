"""Worker entry point: `arq app.worker.WorkerSettings` (settings from the AGENT_* environment).

Importing this module builds the app (which discovers the jobs) and its Agent; arq then runs the
jobs inside the app context, and the Agent's worker hooks open and close the app's database.
"""

from __future__ import annotations

from typing import Any

from app.factory import create_app
from app.runtime import EXTENSION_KEY, AppRuntime

__all__ = ["WorkerSettings", "app", "runtime"]

app = create_app()
runtime: AppRuntime = app.extensions[EXTENSION_KEY]

# arq's CLI accepts a dict; handle_signals stays on so SIGTERM/SIGINT drain gracefully.
WorkerSettings: dict[str, Any] = runtime.agent.worker_settings()
