"""The vLLM rollout worker (sampling with per-token log-probs, policy updates)."""
