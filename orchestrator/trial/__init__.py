"""One trial: the step loop (a Tune trainable), its actors, and the only code that calls workers/."""
