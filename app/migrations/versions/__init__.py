"""Revisions of the application's schema."""
