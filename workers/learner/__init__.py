"""The learner: one rank of the learner group, its update, state, models, ranks, metrics, critic."""
