"""Alembic environment of the application's own tables (version table `app_alembic_version`)."""
