"""The fast worker's finishes: each run's outcome with arq's finish of its job, and the runs that
end together in one script call (engine/lua/finish_batch.lua).

arq ends a run with a transaction of its own (drop the claim; for a job done, its tries, record and
queue entry; for a retry, its new score), and our outcome has to be atomic with it: written in the
same transaction, never one without the other. The fast worker used to put the outcome's script in
front of arq's commands, one MULTI/EXEC per run (or per group of runs, each with its own EVALSHA).
Here the runs that end close together go out as one call of one script: per run, what differs (its
state hash, its event, its record); shared, one call per key (index entries, counters, arq's keys).
The same call claims due jobs for the slots its runs free (FinishClaims: the fast worker, busy), so
a busy worker refills its slots without claim calls of their own.

The runs go out by group commit (store/group_commit.py; no timer unless AGENT_WORKER_FINISH_LINGER_MS
lets a call wait for the runs still holding slots: linger_while_running), at most MAX_BATCH per call.
Each run's reply (and error) is its own; a failure of the whole send (Redis unreachable) is every
run's, and each is sent again by its caller.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from arq.constants import in_progress_key_prefix, retry_key_prefix
from redis.asyncio import Redis

from agent_async.engine.claim import CLAIM_LIB, PICKUP_LIB
from agent_async.errors import AgentError
from agent_async.lifecycle import now_ms
from agent_async.outage import OUTAGE_ERRORS
from agent_async.store import LuaScript, Transition, codec, lua_source, run_script
from agent_async.store.group_commit import GroupCommit, GroupStats

__all__ = ["FINISH_BATCH", "MAX_BATCH", "FinishClaims", "FinishError", "Finisher", "RunEnd", "linger_while_running"]

logger = logging.getLogger(__name__)

# Runs per call at most: Redis serves no one else while a script runs, and ending a run costs it
# some 20 µs: a call stays well under a millisecond.
MAX_BATCH = 32

# The script body, with the pickup and the claim it calls (the store's lib.lua goes in front of it:
# JobStore.ending_in).
FINISH_BATCH = PICKUP_LIB + "\n" + CLAIM_LIB + "\n" + lua_source(
    "agent_async.engine", "finish_batch.lua",
    {"@IN_PROGRESS_PREFIX@": in_progress_key_prefix, "@RETRY_PREFIX@": retry_key_prefix},
)

# finish_batch.lua's "not queued again".
_NOT_REQUEUED = -1


class FinishClaims(Protocol):
    """What a finish call claims for the slots its runs free (the fast worker, when busy)."""

    def claim_for(self, runs: Sequence[str]) -> tuple[int, tuple[str | int, ...]]:
        """How many due jobs to claim with the finish of these runs (engine job ids; 0: none), and
        the claim's arguments after that count (finish_batch.lua's)."""
        ...

    def unanswered(self, claim_args: tuple[str | int, ...]) -> None:
        """The call with this claim failed with an outage error: it may have claimed jobs."""
        ...

    def claimed(self, reply: Any, runs: Sequence[str]) -> None:
        """The claim's reply (claim_lib.lua's): the jobs it took, to run in the slots these runs
        free. Called before the runs are told their finish is written."""
        ...


def linger_while_running(bound_ms: float, in_slots: Callable[[], int]) -> Callable[[int], float]:
    """A busy worker's finishes wait for each other (AGENT_WORKER_FINISH_LINGER_MS): while more runs
    hold slots (`in_slots()`, finishing or not) than finishes wait, the oldest waiting finish may
    wait up to `bound_ms` for the others to join its call. Calls of 10 runs instead of about 3 cost
    Redis a fifth fewer commands and CPU per job, and the worker some of its rate (docs/performance.md)."""
    bound_s = bound_ms / 1000

    def linger(waiting: int) -> float:
        return bound_s if in_slots() > waiting else 0.0

    return linger


class FinishError(AgentError):
    """Redis refused one run's transition inside a batch of finishes (arq's part was done)."""


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How one run ended, for its finish: the outcome to write (None when there is none, e.g. a
    run its start refused), and what becomes of arq's job: `done` takes it out of arq's queue;
    `requeue_ms` queues it again that much later (0: due now); with neither, it stays queued as
    it is (a stop cancelled the run: arq runs it again)."""

    engine_id: str
    transition: Transition | None
    done: bool
    requeue_ms: int | None = None

    def texts(self) -> list[Any]:
        """finish_batch.lua's entry for this run."""
        outcome = self.transition.texts() if self.transition else ["", "", "", "", "", 0]
        requeue = _NOT_REQUEUED if self.requeue_ms is None or self.done else max(0, self.requeue_ms)
        return [self.engine_id, *outcome, 1 if self.done else 0, requeue]


class Finisher:
    """Sends runs' finishes, together when they come together (see the module's docstring).

    `script` and `store_args` come from `JobStore.ending_in(FINISH_BATCH)`; `abort_set` is arq's
    abort set when the worker has arq's aborts on, else '' (nothing reads the set then, and our
    cancel never writes it: arq's ZREM of it is one call per run saved). `batch=False` sends each
    run alone (AGENT_WORKER_COALESCE=false). With `claims`, each call also claims due jobs for the
    slots its runs free (the fast worker: FinishClaims); `linger` lets a call wait for more runs
    (GroupCommit's, linger_while_running)."""

    def __init__(
        self, pool: Callable[[], Redis], script: LuaScript, store_args: tuple[str | int, ...], *, queue: str,
        wake_key: str, abort_set: str = "", batch: bool = True, claims: FinishClaims | None = None,
        linger: Callable[[int], float] | None = None,
    ) -> None:
        # A getter: arq makes its pool when the worker starts (and again after a restart).
        self._pool = pool
        self.script = script
        self._store_args = store_args
        self._keys = (queue, abort_set, wake_key)
        self._claims = claims
        self._group: GroupCommit[RunEnd, None] = GroupCommit(
            self._send, max_batch=MAX_BATCH, together=batch, linger=linger
        )

    @property
    def stats(self) -> GroupStats:
        return self._group.stats

    def log_stats(self, *, claimed_with_them: int) -> None:
        """One line, as the worker stops, on how its finishes went out together."""
        stats = self._group.stats
        if stats.sends:
            logger.info(
                "group commit: %d finishes in %d script calls (largest %d, longest wait %.1f ms); %d jobs claimed "
                "with them", stats.items, stats.sends, stats.largest, stats.longest_wait_ms, claimed_with_them,
            )

    async def finish(self, end: RunEnd) -> None:
        """Write one run's finish (with whatever others are ready). Raises FinishError if Redis
        refused its transition, or the error of the whole send (Redis unreachable, ...)."""
        await self._group.submit(end)

    async def _send(self, ends: list[RunEnd]) -> list[BaseException | None]:
        runs = json.dumps([end.texts() for end in ends])
        engine_ids = [end.engine_id for end in ends]
        wanted, claim_args = self._claims.claim_for(engine_ids) if self._claims is not None else (0, ())
        argv = (now_ms(), *self._store_args, runs, wanted, *claim_args)
        try:
            replies, claimed = await run_script(self._pool(), self.script(self._keys, argv))
        except OUTAGE_ERRORS:
            if wanted and self._claims is not None:
                self._claims.unanswered(claim_args)
            raise
        if claimed is not None and self._claims is not None:
            self._claims.claimed(claimed, engine_ids)
        return [
            FinishError(f"finishing run {end.engine_id}: {codec.text(reply)}") if isinstance(reply, bytes) else None
            for end, reply in zip(ends, replies, strict=True)
        ]
