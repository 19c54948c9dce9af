"""Alembic environment of the application: async drivers, its own version table, the app's MetaData."""

from __future__ import annotations

import app.module.calendar.tables  # noqa: F401 - registers the calendar tables on the MetaData
from agent_async.storage.alembic_env import run_environment
from app.db import APP_VERSION_TABLE, create_app_engine, metadata

run_environment(metadata=metadata, version_table=APP_VERSION_TABLE, make_engine=create_app_engine)
