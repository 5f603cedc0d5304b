"""The shared base of a LoRA campaign (`resources.shared_base`): one set of rollout engines and one learner for
every trial, each trial an adapter in a slot (README: shared base; docs/architecture.md: the pool room)."""
