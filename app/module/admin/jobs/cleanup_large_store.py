"""admin.cleanup.large_store: deletes agent blobs past their age, nobody else's."""

from __future__ import annotations

import logging
from typing import Any

from agent_async import Job, agent_job
from app.module.admin.requests import JobRequestCleanupLargeStore

logger = logging.getLogger(__name__)


@agent_job
class JobCleanupLargeStore(Job[JobRequestCleanupLargeStore]):
    request_class = JobRequestCleanupLargeStore

    async def process(
        self, request: JobRequestCleanupLargeStore, *, user_uid: str | None, job_id: str
    ) -> dict[str, Any]:
        max_age_s = self.resources.settings.large_store_max_age_s
        # The agent's store is scoped to the agent source: contact photos and the like are untouched.
        purged = await self.resources.large_store().purge_older_than(max_age_s)
        logger.info("job %s purged %d agent blob(s) older than %ds", job_id, purged, max_age_s)
        return {"purged": purged, "max_age_s": max_age_s}
