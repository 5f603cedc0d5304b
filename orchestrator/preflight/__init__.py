"""What is checked before launch: plan, cost model, learner memory, model limits, cluster."""
