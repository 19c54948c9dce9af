"""Alembic environment of the blob store: async drivers, its own version table."""

from __future__ import annotations

import agent_async.runs.tables  # its table joins the metadata (F401 is reported on the last import only)
import agent_async.schedules.tables  # noqa: F401  (its tables join the metadata)
from agent_async.storage.alembic_env import run_environment
from agent_async.storage.engine import create_engine, parse_url
from agent_async.storage.schema import VERSION_TABLE, metadata

run_environment(metadata=metadata, version_table=VERSION_TABLE, make_engine=lambda url: create_engine(parse_url(url)))
