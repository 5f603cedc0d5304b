"""`python -m orchestrator eval`: a finished campaign's checkpoints evaluated again on held-out sets, after
training (command.py: the command; offline.py: what is evaluated and written; engine.py: the Ray actor that
samples them). It reads a campaign and drives trial/'s pieces, so it sits above trial/ like tune/ does."""
