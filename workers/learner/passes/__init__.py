"""The learner's passes over a batch: the forward (response-window log-probs, micro-batches), the no-grad scoring
pass, and the chunked per-token statistics both use."""
