"""The policy on the rollout engines: LoRA adapters or full weights, one interface."""
