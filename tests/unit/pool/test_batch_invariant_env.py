"""The pool's engine actors get `resources.shared_base.batch_invariant`'s VLLM_BATCH_INVARIANT=1 in their Ray
runtime_env (set before their process imports vLLM); the learners and the slot registry do not, and without the
setting no engine gets a runtime_env of its own (the job's reaches it unchanged)."""

from __future__ import annotations

import pytest

import orchestrator.pool.actors as pool_actors
import orchestrator.pool.slots as pool_slots
from orchestrator.config.trial import TrialConfig
from orchestrator.pool import lifecycle


class _Actor:
    """A Ray actor class stand-in: records each `.options(...)`."""

    def __init__(self):
        self.options_seen: list[dict] = []

    def options(self, **kw):
        self.options_seen.append(kw)
        return self

    def remote(self, *args, **kwargs):
        return object()


@pytest.mark.parametrize("on", [True, False])
def test_only_the_engines_start_with_the_switch(monkeypatch, tmp_path, on):
    engine, learner, registry = _Actor(), _Actor(), _Actor()
    monkeypatch.setattr(pool_actors, "pool_engine_actor", lambda: engine)
    monkeypatch.setattr(pool_actors, "pool_learner_actor", lambda slots: learner)
    monkeypatch.setattr(pool_slots, "SlotRegistry", registry)
    monkeypatch.setattr(lifecycle, "PlacementGroupSchedulingStrategy", lambda **kw: kw)
    cfg = TrialConfig(learner={"mode": "lora"}, rollout={"num_workers": 2},
                      resources={"worker_gpus": 1, "learner_gpus": 1, "scratch_dir": str(tmp_path),
                                 "shared_base": {"slots": 2, "batch_invariant": on}})
    lifecycle._build(lifecycle.Pool("p", group=None), cfg)
    assert len(engine.options_seen) == 2
    want = {"env_vars": {"VLLM_BATCH_INVARIANT": "1"}} if on else None
    assert [o.get("runtime_env") for o in engine.options_seen] == [want, want]
    assert all("runtime_env" not in o for o in learner.options_seen + registry.options_seen)
