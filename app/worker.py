"""Worker entry point: `arq app.worker.WorkerSettings` (settings from the AGENT_* environment).

Importing this module builds the app (which discovers the jobs) and its Agent; arq then runs the
jobs inside the app context, and the Agent's worker hooks open and close the app's database.
"""

from __future__ import annotations

from typing import Any

from agent_async.logs import configure_logging
from app.factory import create_app
from app.runtime import EXTENSION_KEY, AppRuntime

__all__ = ["WorkerSettings", "app", "runtime"]

app = create_app()
runtime: AppRuntime = app.extensions[EXTENSION_KEY]
# arq's CLI adds a handler of its own after this import; the worker drops it at start-up, and
# `--custom-log-dict agent_async.logs.ARQ_CLI_LOG_CONFIG` keeps it from being added (docs/logging.md).
configure_logging(runtime.settings.agent.log_format)

# arq's CLI accepts a dict; handle_signals stays on so SIGTERM/SIGINT drain gracefully.
WorkerSettings: dict[str, Any] = runtime.agent.worker_settings()
