"""The tiny models built on this machine (reasoner, families, tiny-agent) and their registry (local.py); above
tasks and envs, whose vocabularies and solutions they are built from. Loading any model: workers/models/."""
