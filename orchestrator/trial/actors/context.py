"""What a trial holds fixed from its first step to its last, in one object.

The step pieces (orchestrator/trial/step/sequence.py), the rollout sources (sources.py), one_step_off and the sampler all
need the same handful of things: the config, the rollout workers, the learner, the tokenizer, the task and the
action ids of the probability floor. `run_trial` (loop.py) builds them once and passes this object instead of
six loose parameters; the step index, the adapter version and the SEPA controller's state change every step and
stay separate arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors.calls import Calls
from orchestrator.trial.actors.engines import RolloutEngines
from orchestrator.trial.actors.phases import Phases
from orchestrator.trial.actors.ports import EnginesPort, LearnerPort


@dataclass(frozen=True)
class TrialContext:
    """The trial's fixed parts. `learner`: the `LearnerPort` (ports.py: the backend's, backend.py), None
    where only rollouts run (tests); `actions`: the task's action token ids when the probability floor is on,
    else None; `calls`: the trial's deadlines (orchestrator/trial/actors/calls.py; the default ones where a test builds a
    context); `engines`: the `EnginesPort` the step samples from and pushes policies to (ports.py), by default
    `RolloutEngines` over `workers` (the trial's own rollout actors) under `calls`."""

    cfg: TrialConfig
    workers: list
    learner: LearnerPort | None
    tokenizer: object
    task: object
    actions: list[int] | None = None
    calls: Calls = field(default_factory=Calls)
    phases: Phases = field(default_factory=Phases.off)
    engines: EnginesPort | None = None

    def __post_init__(self):
        if self.engines is None:
            object.__setattr__(self, "engines", RolloutEngines(self.workers, self.calls))
