"""One training step (sequence.py), written once for both rollout modes, the source it collects from, and one_step_off's prefetched batch."""
