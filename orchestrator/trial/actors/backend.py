"""What a trial's steps run on, opened once: its `Backend`. `open_backend` is the one place that asks whether the
trial shares (`resources.shared_base`); the loop, the step and the sources only see the backend's ports
(ports.py), so they never branch on it.

- `OwnActors`: the trial's own rollout workers and learner group in its placement group (start.py), its engines
  `RolloutEngines` over the workers (engines.py). Closing it does nothing: the actors end with the trial (a missed
  deadline kills them first: loop.py's hang handler, start.py:shutdown_actors).
- `PoolSlot` (shared.py): the trial's slot of the campaign's shared pool, opened fresh by `connect`; no rollout
  worker of its own; its opening is the `slot` event; closing it releases the slot."""

from __future__ import annotations

from typing import Protocol

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors.calls import Calls, check_health
from orchestrator.trial.actors.engines import RolloutEngines
from orchestrator.trial.actors.ports import EnginesPort, LearnerPort
from orchestrator.trial.actors.shared import connect
from orchestrator.trial.actors.start import placement_record, rollout_names, start_actors


class Backend(Protocol):
    """A trial's engines and learner, as one thing it opens, records and closes."""

    engines: EnginesPort
    learner: LearnerPort
    workers: list  # the trial's own rollout worker actors (none on a pool slot): what a hang kills with the learner
    events: list[dict]  # events.jsonl lines of the opening (a pool slot: its `slot` event), written once by the loop

    def placement(self) -> dict:
        """placement.json's record: where the driver, the engines and the learner run. Waits for the trial's own
        rollout workers to have built their engines, and checks every engine's health (a trial's own or the
        pool's), under the setup deadline."""
        ...

    def close(self) -> None:
        """The trial is done with its backend (it ended or failed): a pool slot's release; nothing for own actors."""
        ...


class OwnActors:
    """The trial's own rollout workers and learner group (start.py:start_actors), in its placement group `pg`."""

    def __init__(self, cfg: TrialConfig, pg, calls: Calls):
        self.cfg, self.pg, self.calls = cfg, pg, calls
        self.workers, self.learner = start_actors(cfg, pg, calls)
        self.engines = RolloutEngines(self.workers, calls)
        self.events: list[dict] = []

    def placement(self) -> dict:
        names = rollout_names(self.workers)
        self.calls.get([w.ready.remote() for w in self.workers], "setup", names)
        health = check_health(self.calls, names)  # also: the engines' pids, for the placement record
        return placement_record(self.pg, self.workers, self.learner, health, self.cfg.resources.placement, self.calls)

    def close(self) -> None:
        """Nothing: the actors end with the trial (Tune), as they always have."""


def open_backend(cfg: TrialConfig, pg, calls: Calls) -> Backend:
    """The trial's backend: its own actors in `pg`, or its slot of the campaign's shared pool (`resources.
    shared_base`), taken and opened fresh (shared.py:connect gives the slot back itself when it fails after taking
    it). `calls`: the trial's deadlines, which every call of the backend waits under."""
    if cfg.resources.shared_base is None:
        return OwnActors(cfg, pg, calls)
    return connect(cfg, calls, pg)
