"""Periodic jobs: the cron model (cron.py), the scheduler that turns a tick into one run
(scheduler.py), and the operator's runtime overrides with their SQL tables (overrides.py, tables.py).

Nothing is re-exported here: JobRequest imports the cron model, and the scheduler imports JobRequest.
"""
