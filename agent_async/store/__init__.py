"""The Redis layout of the job layer: key space, JobState hash, JSON codec and the Lua scripts."""

from __future__ import annotations

from agent_async.store.jobs import JobStore
from agent_async.store.keys import GLOBAL_SCOPE, KeySpace
from agent_async.store.readiness import check_buffers
from agent_async.store.scripts import LuaScript, ScriptCall, lua_source, run_script
from agent_async.store.types import CancelReply, EngineJob, EngineQueue, EngineRef, EngineRun, GateClaim, Transition

__all__ = [
    "GLOBAL_SCOPE",
    "CancelReply",
    "EngineJob",
    "EngineQueue",
    "EngineRef",
    "EngineRun",
    "GateClaim",
    "JobStore",
    "KeySpace",
    "LuaScript",
    "ScriptCall",
    "Transition",
    "check_buffers",
    "lua_source",
    "run_script",
]
