"""A trial's actors: the engines and the learner the step reaches (ports.py), how every call on them waits (calls.py), and what the trial holds fixed (context.py)."""
