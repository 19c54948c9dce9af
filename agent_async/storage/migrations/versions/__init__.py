"""Alembic revisions of the blob store."""
