"""mysvc: a service of its own that embeds agent_async (no Quart, no reference app)."""
