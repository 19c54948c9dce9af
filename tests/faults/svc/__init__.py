"""A job package for `python -m agent_async worker --jobs tests.faults.svc` (shutdown tests)."""
