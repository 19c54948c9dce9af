"""Alembic environment of the blob store (a package so installs ship it)."""
