"""Job modules of the browser tests' API and worker processes (AGENT_JOB_PACKAGES names this package)."""
