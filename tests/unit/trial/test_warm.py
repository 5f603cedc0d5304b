"""Which trials may run on another trial's warm actors (orchestrator/trial/warm.py:warm_key): those whose actors
would be built the same way. That a warm trial then reports a fresh start's metrics is
tests/integration/trial/test_interventions.py's."""

from __future__ import annotations

import pytest

from orchestrator.config.trial import TrialConfig
from orchestrator.trial.warm import warm_key

BASE = {"model": {"name": "tiny"}, "task": {"name": "arithmetic"}, "rollout": {"num_workers": 1}}


def _cfg(**over) -> TrialConfig:
    data = {**BASE, **over}
    data["rollout"] = {**BASE["rollout"], **over.get("rollout", {})}
    return TrialConfig(**data)


class _PG:
    def __init__(self, hex_id: str):
        self.id = type("Id", (), {"hex": lambda _self: hex_id})()


@pytest.mark.parametrize("other", [
    {"seed": 7},  # every request carries its own seed (benchmarks/engine_start.py holds the engine's seed inert)
    {"credit": {"advantage_mode": "maxrl"}},  # learner settings: the reset learner is built from them
    {"interventions": {"kl": {"coef": 0.5}}},
    {"rollout": {"temperature": 0.5, "prompts_per_step": 4}},  # per-request sampling
    {"task": {"name": "arithmetic_mc"}},
    {"steps": 3},
])
def test_what_the_actors_are_not_built_from_may_differ(other):
    assert warm_key(_cfg(), None) is not None
    assert warm_key(_cfg(**other), None) == warm_key(_cfg(), None)


@pytest.mark.parametrize("other", [
    {"model": {"name": "tiny-reasoner"}},
    {"model": {"name": "tiny", "max_model_len": 512}},
    {"rollout": {"engine": {"enable_prefix_caching": False}}},
    {"rollout": {"engine": {"in_process": False}}},
    {"rollout": {"num_workers": 2}},
    {"learner": {"lora": {"rank": 16}}},
    {"resources": {"worker_cpus": 2}},
])
def test_what_the_actors_are_built_from_must_match(other):
    assert warm_key(_cfg(**other), None) not in (None, warm_key(_cfg(), None))


def test_another_placement_group_never_matches():
    assert warm_key(_cfg(), _PG("a")) != warm_key(_cfg(), _PG("b"))


@pytest.mark.parametrize("never", [
    {"learner": {"mode": "full"}},  # the engine's base weights were overwritten
    {"resources": {"learner_ranks": 2}},  # the process group belongs to the trial that formed it
    {"resources": {"placement": "colocated", "learner_gpus": 1}},  # engines sleep beside their ranks
])
def test_full_weights_grouped_ranks_and_colocated_trials_never_reuse(never):
    assert warm_key(_cfg(**never), None) is None
