"""W&B: the run of each trial, the offline reader, the dashboard, metric names, login."""
