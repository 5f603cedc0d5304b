"""The shared learner: one process holding a base model's weights once and, per slot, one trial's LoRA learner."""
