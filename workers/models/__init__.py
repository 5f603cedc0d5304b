"""Models by hub name or local path, and the tiny local models (reasoner, families, tiny-agent)."""
