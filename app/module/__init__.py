"""Business modules of the reference application; each may hold a `jobs/` package found by init_jobs."""
