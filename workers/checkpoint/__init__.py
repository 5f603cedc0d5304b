"""Checkpoint files: the learner blob, sharded DCP checkpoints, the safe shard reader."""
