"""Collecting rollouts: the rollout sources (single turn, episodes, a mix), the refill, sampling, and the held-out evaluation they run."""
