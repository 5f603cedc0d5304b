"""`open_backend` (orchestrator/trial/actors/backend.py), the one place a trial asks whether it shares: its own
actors for a separate trial, its slot of the pool for a shared-base one; either way the loop gets engines, a
learner, the rollout workers a hang kills, the events of the opening and `close`."""

from __future__ import annotations

from types import SimpleNamespace

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.actors import backend
from orchestrator.trial.actors.calls import Calls
from orchestrator.trial.actors.engines import RolloutEngines

BASE = {"model": {"name": "tiny"}, "task": {"name": "arithmetic"}, "learner": {"mode": "lora"}}


def test_a_separate_trial_opens_its_own_actors_and_a_shared_one_its_slot(monkeypatch):
    started, connected = [], []
    workers, learner, slot = ["worker0", "worker1"], SimpleNamespace(), SimpleNamespace()
    monkeypatch.setattr(backend, "start_actors", lambda cfg, pg, calls: started.append(pg) or (workers, learner))
    monkeypatch.setattr(backend, "connect", lambda cfg, calls, pg: connected.append(pg) or slot)
    calls = Calls()

    own = backend.open_backend(TrialConfig(**BASE), "pg", calls)
    assert isinstance(own, backend.OwnActors) and (started, connected) == (["pg"], [])
    assert own.workers == workers and own.learner is learner and own.events == []
    assert isinstance(own.engines, RolloutEngines) and own.engines.workers == workers
    assert own.engines.initial_versions == {None, 0}
    own.close()  # nothing: the actors end with the trial

    shared = TrialConfig(**{**BASE, "resources": {"shared_base": {"slots": 2}}})
    assert backend.open_backend(shared, "pg", calls) is slot and (started, connected) == (["pg"], ["pg"])
