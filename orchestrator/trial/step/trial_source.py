"""The trial's one rollout source, chosen once: the task's (single turn, episodes, or a mix: mixed.py) wrapped in
the refill (fill.py: `Refill`; a mix refills each member on its own), or under `replay:` the saved batches
(replay.py) with the task's held-out evaluation. The step only calls `collect(step)` and `evaluate(step)` on it,
whichever it is."""

from __future__ import annotations

from orchestrator.trial.actors.context import TrialContext
from orchestrator.trial.artifacts.replay import replay_source
from orchestrator.trial.collect.mixed import task_source
from orchestrator.trial.collect.sources import RolloutSource


def trial_source(ctx: TrialContext) -> RolloutSource:
    """`ctx`'s source: the task's, refilled to rollout.fill (one round without it); or the replayed run's."""
    return replay_source(ctx, task_source(ctx))
